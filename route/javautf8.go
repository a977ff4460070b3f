package route

import (
	"bytes"
	"encoding/base64"
	"slices"
	"unicode/utf8"
)

// The broker reads a partition key as a Java String (LightProto decodes the field with
// new String(bytes, UTF_8)) and hashes String.getBytes(UTF_8). Valid UTF-8 survives that round
// trip unchanged; each malformed sequence becomes one U+FFFD, grouped as the JDK's decoder
// groups them, which is neither "one per byte" nor Unicode's "maximal subpart" everywhere (a
// UTF-8-encoded surrogate is one replacement, a lead byte above F4 is one per byte).
// testdata/java-utf8.txt holds what a real JDK printed for thousands of such inputs.

// replacement is U+FFFD in UTF-8.
const replacement = "\uFFFD"

// appendJavaUTF8 appends s as the broker's JDK decodes and re-encodes it.
func appendJavaUTF8[S ~string | ~[]byte](dst []byte, s S) []byte {
	for i := 0; i < len(s); {
		valid, consumed := javaSequence(s[i:])
		if valid {
			dst = append(dst, s[i:i+consumed]...)
		} else {
			dst = append(dst, replacement...)
		}
		i += consumed
	}
	return dst
}

// AppendPartitionKey appends to dst the bytes the broker hashes for a partition key (the
// field's raw bytes, flagged base64 or not): base64-decoded as java.util.Base64.getDecoder()
// decodes (standard alphabet, padding optional but correct when present, no line breaks,
// which Go's decoder would skip), or read as a Java String (appendJavaUTF8). A flagged key that does not decode is ErrBadBase64Key (the broker
// then uses NONE_KEY). It allocates only to grow dst. Any goroutine may call it.
func AppendPartitionKey(dst, pk []byte, b64 bool) ([]byte, error) {
	switch {
	case !b64 && utf8.Valid(pk):
		return append(dst, pk...), nil
	case !b64:
		return appendJavaUTF8(dst, pk), nil
	case bytes.ContainsAny(pk, "\r\n"):
		return dst, ErrBadBase64Key
	}
	enc := base64.StdEncoding
	if len(pk)%4 != 0 {
		enc = base64.RawStdEncoding
	}
	n := len(dst)
	dst = slices.Grow(dst, enc.DecodedLen(len(pk)))
	m, err := enc.Decode(dst[n:n+enc.DecodedLen(len(pk))], pk)
	if err != nil {
		return dst[:n], ErrBadBase64Key
	}
	return dst[:n+m], nil
}

// javaSequence reports whether s starts with a well-formed sequence and how many bytes the
// JDK's decoder consumes there (for a malformed one: the bytes one U+FFFD replaces).
func javaSequence[S ~string | ~[]byte](s S) (valid bool, n int) {
	b1 := s[0]
	switch {
	case b1 < 0x80:
		return true, 1
	case b1 >= 0xC2 && b1 <= 0xDF:
		if len(s) >= 2 && continuation(s[1]) {
			return true, 2
		}
		return false, 1
	case b1 >= 0xE0 && b1 <= 0xEF:
		return javaThree(s)
	case b1 >= 0xF0 && b1 <= 0xF7:
		return javaFour(s)
	}
	return false, 1 // a continuation byte, C0, C1 or F8..FF
}

// javaThree handles a three-byte lead (E0..EF).
func javaThree[S ~string | ~[]byte](s S) (bool, int) {
	b1 := s[0]
	badSecond := func(b2 byte) bool { return (b1 == 0xE0 && b2&0xE0 == 0x80) || !continuation(b2) }
	if len(s) < 3 {
		if len(s) == 2 && badSecond(s[1]) {
			return false, 1
		}
		return false, len(s) // a truncated but well-begun sequence at the end: one U+FFFD
	}
	b2, b3 := s[1], s[2]
	switch {
	case badSecond(b2):
		return false, 1
	case !continuation(b3):
		return false, 2
	case b1 == 0xED && b2 >= 0xA0:
		return false, 3 // an encoded surrogate: one U+FFFD for all three bytes
	}
	return true, 3
}

// javaFour handles a four-byte lead (F0..F7).
func javaFour[S ~string | ~[]byte](s S) (bool, int) {
	b1 := s[0]
	badSecond := func(b2 byte) bool {
		return b1 > 0xF4 || (b1 == 0xF0 && (b2 < 0x90 || b2 > 0xBF)) || (b1 == 0xF4 && b2&0xF0 != 0x80) || !continuation(b2)
	}
	if len(s) < 4 {
		switch {
		case b1 > 0xF4 || (len(s) >= 2 && badSecond(s[1])):
			return false, 1
		case len(s) == 3 && !continuation(s[2]):
			return false, 2
		}
		return false, len(s)
	}
	b2, b3, b4 := s[1], s[2], s[3]
	switch {
	case badSecond(b2):
		return false, 1
	case !continuation(b3):
		return false, 2
	case !continuation(b4):
		return false, 3
	}
	return true, 4
}

func continuation(b byte) bool { return b&0xC0 == 0x80 }
