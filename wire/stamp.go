package wire

import (
	"encoding/binary"

	"github.com/rebatchproxy/rebatchproxy/wire/internal/pbscan"
)

// Field numbers of MessageMetadata that Stamp rewrites.
const (
	mdSequenceID         = 2
	mdProperties         = 4
	mdNumMessagesInBatch = 11
	mdOrderingKey        = 18
	mdHighestSequenceID  = 24
	mdEntryHashMin       = 33
	mdEntryHashMax       = 34
)

// KeyValue is one property for Stamp.
type KeyValue struct{ Key, Value string }

// Stamp lists edits to an encoded MessageMetadata, applied without decoding
// it (AppendStampedMetadata, AppendStampedFrame): every field the stamp
// does not touch is copied byte for byte, unknown fields included, and the
// stamped fields are appended after them. Protobuf decoders accept fields in
// any order, so the result decodes to the same message the Set* helpers
// produce, except that stamped properties come last.
//
// The Set* flags say which scalar fields to replace; a zero Stamp copies
// the metadata unchanged.
type Stamp struct {
	// SetProperties sets each key to its value: every existing property
	// with that key is removed and one entry appended.
	SetProperties []KeyValue
	// DeleteProperties removes every property with one of these keys.
	DeleteProperties []string

	SetOrderingKey bool
	OrderingKey    []byte // nil with SetOrderingKey removes the field

	SetNumMessagesInBatch bool
	NumMessagesInBatch    int32

	SetSequenceID bool
	SequenceID    uint64

	SetHighestSequenceID bool
	HighestSequenceID    uint64

	SetEntryHashRange bool
	EntryHashMin      uint32 // PIP-486 field 33
	EntryHashMax      uint32 // PIP-486 field 34
}

// AppendStampedMetadata appends md with the edits of s applied. It does not
// allocate when dst has room. A malformed md returns ErrMalformedMetadata
// and dst unchanged.
func AppendStampedMetadata(dst, md []byte, s *Stamp) ([]byte, error) {
	start := len(dst)
	for i := 0; i < len(md); {
		f, n := pbscan.Next(md[i:])
		if n == 0 {
			return dst[:start], ErrMalformedMetadata
		}
		if !s.drops(f) {
			dst = append(dst, md[i:i+n]...)
		}
		i += n
	}
	for _, p := range s.SetProperties {
		l := 1 + pbscan.VarintLen(uint64(len(p.Key))) + len(p.Key) + 1 + pbscan.VarintLen(uint64(len(p.Value))) + len(p.Value)
		dst = pbscan.AppendTag(dst, mdProperties, pbscan.Bytes)
		dst = pbscan.AppendVarint(dst, uint64(l))
		dst = appendString(dst, 1, p.Key)
		dst = appendString(dst, 2, p.Value)
	}
	if s.SetNumMessagesInBatch {
		dst = pbscan.AppendTag(dst, mdNumMessagesInBatch, pbscan.Varint)
		dst = pbscan.AppendVarint(dst, uint64(int64(s.NumMessagesInBatch)))
	}
	if s.SetSequenceID {
		dst = pbscan.AppendTag(dst, mdSequenceID, pbscan.Varint)
		dst = pbscan.AppendVarint(dst, s.SequenceID)
	}
	if s.SetOrderingKey && s.OrderingKey != nil {
		dst = pbscan.AppendTag(dst, mdOrderingKey, pbscan.Bytes)
		dst = pbscan.AppendVarint(dst, uint64(len(s.OrderingKey)))
		dst = append(dst, s.OrderingKey...)
	}
	if s.SetHighestSequenceID {
		dst = pbscan.AppendTag(dst, mdHighestSequenceID, pbscan.Varint)
		dst = pbscan.AppendVarint(dst, s.HighestSequenceID)
	}
	if s.SetEntryHashRange {
		dst = pbscan.AppendTag(dst, mdEntryHashMin, pbscan.Varint)
		dst = pbscan.AppendVarint(dst, uint64(s.EntryHashMin))
		dst = pbscan.AppendTag(dst, mdEntryHashMax, pbscan.Varint)
		dst = pbscan.AppendVarint(dst, uint64(s.EntryHashMax))
	}
	return dst, nil
}

func appendString(dst []byte, num uint64, v string) []byte {
	dst = pbscan.AppendTag(dst, num, pbscan.Bytes)
	dst = pbscan.AppendVarint(dst, uint64(len(v)))
	return append(dst, v...)
}

// drops reports whether the stamp replaces or removes field f.
func (s *Stamp) drops(f pbscan.Field) bool {
	switch f.Num {
	case mdProperties:
		if f.WireType != pbscan.Bytes || len(s.SetProperties)+len(s.DeleteProperties) == 0 {
			return false
		}
		key, _, ok := pbscan.LastBytes(f.B, 1)
		if !ok {
			return false // not ours to judge: copy it as it is
		}
		for _, p := range s.SetProperties {
			if string(key) == p.Key {
				return true
			}
		}
		for _, k := range s.DeleteProperties {
			if string(key) == k {
				return true
			}
		}
		return false
	case mdOrderingKey:
		return s.SetOrderingKey && f.WireType == pbscan.Bytes
	}
	// A field with an unexpected wire type is an unknown field to every
	// decoder: keep it, as a decode and re-encode would.
	if f.WireType != pbscan.Varint {
		return false
	}
	switch f.Num {
	case mdSequenceID:
		return s.SetSequenceID
	case mdNumMessagesInBatch:
		return s.SetNumMessagesInBatch
	case mdHighestSequenceID:
		return s.SetHighestSequenceID
	case mdEntryHashMin, mdEntryHashMax:
		return s.SetEntryHashRange
	}
	return false
}

// AppendStampedFrame appends a copy of the payload frame f with its
// metadata stamped (see Stamp), written straight into dst: the command,
// any broker entry metadata and the payload are copied unchanged and the
// checksum is recomputed. It does not allocate when dst has room. Use
// AppendSendFrame with AppendStampedMetadata's output when the CommandSend
// must change too.
func AppendStampedFrame(dst []byte, f Frame, s *Stamp) ([]byte, error) {
	if !f.HasPayload() {
		return dst, ErrNotPayloadFrame
	}
	dst, start := appendFrameHead(dst, f)
	dst = binary.BigEndian.AppendUint16(dst, MagicChecksum)
	crcAt := len(dst)
	dst = append(dst, 0, 0, 0, 0, 0, 0, 0, 0)
	dst, err := AppendStampedMetadata(dst, f.Metadata(), s)
	if err != nil {
		return dst[:start], err
	}
	binary.BigEndian.PutUint32(dst[crcAt+4:], uint32(len(dst)-crcAt-8))
	dst = append(dst, f.Payload()...)
	binary.BigEndian.PutUint32(dst[crcAt:], CRC32C(dst[crcAt+4:]))
	endFrame(dst, start)
	return dst, nil
}
