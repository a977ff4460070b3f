// Package pbscan reads protobuf wire format field by field without
// allocating, for the few hot-path messages the proxy inspects without a
// full decode (BaseCommand type, CommandSend, CommandSendReceipt,
// SingleMessageMetadata). Everything else uses the generated code.
//
// The functions are pure and safe for concurrent use.
package pbscan

import "math"

// Wire types. Pulsar messages never use groups, but protobuf decoders
// (Go's, and so the proxy's full decodes) skip a group found where an
// unknown field may be, so Next skips them too rather than call the
// message malformed.
const (
	Varint     = 0
	Fixed64    = 1
	Bytes      = 2
	StartGroup = 3
	EndGroup   = 4
	Fixed32    = 5
)

// MaxFieldNumber is the largest field number protobuf allows (2^29-1); the runtime refuses
// larger ones, and so does Next.
const MaxFieldNumber = 1<<29 - 1

// maxGroupDepth bounds group nesting, as the protobuf runtime bounds
// recursion, so hostile input cannot make skipping quadratic or deep.
const maxGroupDepth = 100

// Field is one decoded field. For Varint, Fixed64 and Fixed32 the value is
// in V (fixed types little-endian as on the wire); for Bytes the contents
// are in B, aliasing the input.
type Field struct {
	Num      uint64
	WireType uint64
	V        uint64
	B        []byte
}

// Uvarint decodes a varint at the start of b. n is 0 when b is truncated
// or the varint is longer than 10 bytes or overflows 64 bits.
func Uvarint(b []byte) (v uint64, n int) {
	// One-byte varints (tags, small ids) are the common case.
	if len(b) > 0 && b[0] < 0x80 {
		return uint64(b[0]), 1
	}
	var shift uint
	for i := 0; i < len(b) && i < 10; i++ {
		c := b[i]
		if i == 9 && c > 1 {
			return 0, 0
		}
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return v, i + 1
		}
		shift += 7
	}
	return 0, 0
}

// NextSmall is Next for the common fields of a one-byte key and a one-byte varint value or
// length (small ids, flags, counts, short strings): n is 0 for any other field, which the caller
// then passes to Next. It is small enough for the compiler to inline into a field loop; on the
// rewriting path a call per field cost more than decoding it.
func NextSmall(b []byte) (f Field, n int) {
	if len(b) >= 2 && b[0] >= 8 && b[1] < 0x80 {
		num, l := uint64(b[0]>>3), int(b[1])
		switch b[0] & 0x87 {
		case Varint:
			return Field{Num: num, V: uint64(l)}, 2
		case Bytes:
			if l <= len(b)-2 {
				return Field{Num: num, WireType: Bytes, B: b[2 : 2+l]}, 2 + l
			}
		}
	}
	return Field{}, 0
}

// Next decodes the field at the start of b and returns the bytes it used,
// or 0 when b is malformed (truncated, field number 0 or above 2^29-1, a stray end-group,
// an unterminated group). For a group, B holds its contents.
func Next(b []byte) (Field, int) {
	// The common case first: a one-byte key with a one-byte value or length (small ids,
	// flags, short strings), decoded without the general path's varint loops.
	if len(b) >= 2 && b[0] < 0x80 && b[1] < 0x80 && b[0]>>3 != 0 {
		num, wt := uint64(b[0]>>3), uint64(b[0]&7)
		switch wt {
		case Varint:
			return Field{Num: num, WireType: wt, V: uint64(b[1])}, 2
		case Bytes:
			if l := int(b[1]); l <= len(b)-2 {
				return Field{Num: num, WireType: wt, B: b[2 : 2+l]}, 2 + l
			}
			return Field{}, 0
		}
	}
	key, n := Uvarint(b)
	if n == 0 || key>>3 == 0 || key>>3 > MaxFieldNumber {
		return Field{}, 0
	}
	f := Field{Num: key >> 3, WireType: key & 7}
	switch f.WireType {
	case Varint:
		v, m := Uvarint(b[n:])
		if m == 0 {
			return Field{}, 0
		}
		f.V = v
		return f, n + m
	case Fixed64:
		if len(b)-n < 8 {
			return Field{}, 0
		}
		for i := 7; i >= 0; i-- {
			f.V = f.V<<8 | uint64(b[n+i])
		}
		return f, n + 8
	case Bytes:
		l, m := Uvarint(b[n:])
		if m == 0 || l > uint64(len(b)-n-m) {
			return Field{}, 0
		}
		f.B = b[n+m : n+m+int(l)]
		return f, n + m + int(l)
	case Fixed32:
		if len(b)-n < 4 {
			return Field{}, 0
		}
		f.V = uint64(b[n]) | uint64(b[n+1])<<8 | uint64(b[n+2])<<16 | uint64(b[n+3])<<24
		return f, n + 4
	case StartGroup:
		contents, end, ok := skipGroup(b[n:], f.Num)
		if !ok {
			return Field{}, 0
		}
		f.B = b[n : n+contents]
		return f, n + end
	}
	return Field{}, 0
}

// skipGroup returns the length of a group's contents and of the contents
// plus its end-group tag, for a group of field num whose start tag has been
// consumed.
func skipGroup(b []byte, num uint64) (contents, end int, ok bool) {
	// The stack of open group numbers lives in a fixed array: no recursion,
	// no allocation.
	var open [maxGroupDepth]uint64
	depth := 0
	open[0] = num
	for i := 0; i < len(b); {
		tag := i
		key, n := Uvarint(b[i:])
		// Inside a group the runtime reads tags as protowire.ConsumeTag does, taking any
		// field number that fits an int32, not only those up to MaxFieldNumber.
		if n == 0 || key>>3 == 0 || key>>3 > math.MaxInt32 {
			return 0, 0, false
		}
		i += n
		switch key & 7 {
		case Varint:
			_, m := Uvarint(b[i:])
			if m == 0 {
				return 0, 0, false
			}
			i += m
		case Fixed64:
			if len(b)-i < 8 {
				return 0, 0, false
			}
			i += 8
		case Bytes:
			l, m := Uvarint(b[i:])
			if m == 0 || l > uint64(len(b)-i-m) {
				return 0, 0, false
			}
			i += m + int(l)
		case Fixed32:
			if len(b)-i < 4 {
				return 0, 0, false
			}
			i += 4
		case StartGroup:
			depth++
			if depth == maxGroupDepth {
				return 0, 0, false
			}
			open[depth] = key >> 3
		case EndGroup:
			if key>>3 != open[depth] {
				return 0, 0, false
			}
			if depth == 0 {
				return tag, i, true
			}
			depth--
		default:
			return 0, 0, false
		}
	}
	return 0, 0, false
}

// Valid reports whether msg is a well-formed sequence of top-level fields
// (nested messages are not descended into).
func Valid(msg []byte) bool {
	for i := 0; i < len(msg); {
		_, n := Next(msg[i:])
		if n == 0 {
			return false
		}
		i += n
	}
	return true
}

// LastBytes returns the last occurrence of length-delimited field num in
// msg, which is what a decoder keeps for a non-repeated field. ok is false
// when msg is malformed; found is false when the field is absent.
func LastBytes(msg []byte, num uint64) (b []byte, found, ok bool) {
	for i := 0; i < len(msg); {
		f, n := Next(msg[i:])
		if n == 0 {
			return nil, false, false
		}
		i += n
		if f.Num == num && f.WireType == Bytes {
			b, found = f.B, true
		}
	}
	return b, found, true
}

// AppendVarint appends v as a varint.
func AppendVarint(dst []byte, v uint64) []byte {
	for v >= 0x80 {
		dst = append(dst, byte(v)|0x80)
		v >>= 7
	}
	return append(dst, byte(v))
}

// AppendTag appends the key of field num with the given wire type.
func AppendTag(dst []byte, num, wireType uint64) []byte {
	return AppendVarint(dst, num<<3|wireType)
}

// VarintLen returns the encoded length of v.
func VarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}
