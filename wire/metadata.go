package wire

import (
	"bytes"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// DecodeMetadata decodes an encoded MessageMetadata (Frame.Metadata) into
// md, replacing its contents. Missing required fields are accepted, as a
// broker would; unknown fields (for example from a newer client) are kept
// and written back by AppendMetadata and the frame encoders.
func DecodeMetadata(b []byte, md *pulsarpb.MessageMetadata) error {
	if err := decodeOpts.Unmarshal(b, md); err != nil {
		return ErrMalformedMetadata
	}
	return nil
}

// AppendMetadata appends the encoding of md to dst.
func AppendMetadata(dst []byte, md *pulsarpb.MessageMetadata) ([]byte, error) {
	return encodeOpts.MarshalAppend(dst, md)
}

// AppendRestampedFrame appends a copy of the payload frame f with its
// MessageMetadata replaced by md. The command bytes, any broker entry
// metadata and the payload bytes are copied unchanged; the checksum is
// recomputed. Use AppendSendFrameMetadata instead when the CommandSend
// must change too (sequence ids, num_messages).
func AppendRestampedFrame(dst []byte, f Frame, md *pulsarpb.MessageMetadata) ([]byte, error) {
	if !f.HasPayload() {
		return dst, ErrNotPayloadFrame
	}
	dst, start := appendFrameHead(dst, f)
	dst, err := appendMetadataAndPayload(dst, md, f.Payload())
	if err != nil {
		return dst[:start], err
	}
	endFrame(dst, start)
	return dst, nil
}

// The stamping helpers below edit a decoded MessageMetadata in place; call
// AppendRestampedFrame or AppendSendFrameMetadata afterwards to re-encode
// it. They never touch the payload.

// SetProperty sets key to value in md.properties. The first property with
// that key keeps its position and takes the new value; later duplicates are
// removed, so the key appears exactly once.
func SetProperty(md *pulsarpb.MessageMetadata, key, value string) {
	props := md.Properties
	found := false
	out := props[:0]
	for _, kv := range props {
		if kv.GetKey() != key {
			out = append(out, kv)
			continue
		}
		if !found {
			found = true
			kv.Value = proto.String(value)
			out = append(out, kv)
		}
	}
	clear(props[len(out):])
	if !found {
		out = append(out, &pulsarpb.KeyValue{Key: proto.String(key), Value: proto.String(value)})
	}
	md.Properties = out
}

// DeleteProperty removes every property with the given key.
func DeleteProperty(md *pulsarpb.MessageMetadata, key string) {
	props := md.Properties
	out := props[:0]
	for _, kv := range props {
		if kv.GetKey() != key {
			out = append(out, kv)
		}
	}
	clear(props[len(out):])
	md.Properties = out
}

// Property returns the value of the first property named key.
func Property(md *pulsarpb.MessageMetadata, key string) (string, bool) {
	for _, kv := range md.GetProperties() {
		if kv.GetKey() == key {
			return kv.GetValue(), true
		}
	}
	return "", false
}

// SetEntryHashRange stamps PIP-486's entry_hash_min (33) and
// entry_hash_max (34), both inclusive.
func SetEntryHashRange(md *pulsarpb.MessageMetadata, lo, hi uint32) {
	md.EntryHashMin = proto.Uint32(lo)
	md.EntryHashMax = proto.Uint32(hi)
}

// SetOrderingKey sets ordering_key (18), the key Key_Shared dispatch
// prefers; nil removes it. The slice is copied.
func SetOrderingKey(md *pulsarpb.MessageMetadata, key []byte) {
	if key == nil {
		md.OrderingKey = nil
		return
	}
	md.OrderingKey = bytes.Clone(key)
}

// SetNumMessagesInBatch sets num_messages_in_batch (11). Its presence makes
// the entry a batch even when n is 1, which keeps stamped outer fields
// invisible to consumers.
func SetNumMessagesInBatch(md *pulsarpb.MessageMetadata, n int32) {
	md.NumMessagesInBatch = proto.Int32(n)
}

// SetSequenceIDs sets sequence_id (2) to lowest and highest_sequence_id
// (24) to highest, the pair broker de-duplication compares. When highest
// is not above lowest, highest_sequence_id is removed.
func SetSequenceIDs(md *pulsarpb.MessageMetadata, lowest, highest uint64) {
	md.SequenceId = proto.Uint64(lowest)
	if highest > lowest {
		md.HighestSequenceId = proto.Uint64(highest)
	} else {
		md.HighestSequenceId = nil
	}
}

// SetCompression records the payload codec and the size of the payload
// before compression.
func SetCompression(md *pulsarpb.MessageMetadata, c pulsarpb.CompressionType, uncompressedSize int) {
	if c == pulsarpb.CompressionType_NONE {
		md.Compression = nil
	} else {
		md.Compression = c.Enum()
	}
	md.UncompressedSize = proto.Uint32(uint32(uncompressedSize))
}
