package wire

import (
	"encoding/binary"

	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// EntryMetadata is the outer MessageMetadata of an entry the proxy builds in batch format.
// AppendEntryMetadata encodes it without allocating; its byte slices are read, never kept.
type EntryMetadata struct {
	ProducerName      string
	SequenceID        uint64
	HighestSequenceID uint64
	PublishTime       uint64
	HasPublishTime    bool
	// Properties are key/value pairs, written in order (PIP-191's batch properties).
	Properties []Property
	// Key: PartitionKey (with PartitionKeyB64Encoded) or OrderingKey, kept present when empty.
	PartitionKey           []byte
	HasPartitionKey        bool
	PartitionKeyB64Encoded bool
	OrderingKey            []byte
	HasOrderingKey         bool
	Compression            pulsarpb.CompressionType // NONE is left out
	UncompressedSize       uint32
	NumMessagesInBatch     int32
	SchemaVersion          []byte
	HasSchemaVersion       bool
	// EntryHashMin and EntryHashMax are PIP-486's fields 33 and 34, both inclusive.
	EntryHashMin, EntryHashMax uint32
	HasEntryHashRange          bool
}

// Property is one key/value of EntryMetadata.Properties.
type Property struct{ Key, Value []byte }

// AppendEntryMetadata appends the encoding of m, fields in field-number order as the protobuf
// runtime writes them deterministically. It does not allocate when dst has room.
func AppendEntryMetadata(dst []byte, m *EntryMetadata) []byte {
	dst = appendBytesField(dst, mdProducerName, m.ProducerName)
	dst = appendVarintField(dst, mdSequenceID, m.SequenceID)
	if m.HasPublishTime {
		dst = appendVarintField(dst, mdPublishTime, m.PublishTime)
	}
	for _, p := range m.Properties {
		// KeyValue: key (1) and value (2).
		n := 1 + uvarintLen(uint64(len(p.Key))) + len(p.Key) + 1 + uvarintLen(uint64(len(p.Value))) + len(p.Value)
		dst = binary.AppendUvarint(dst, mdProperties<<3|2)
		dst = binary.AppendUvarint(dst, uint64(n))
		dst = appendBytesField(dst, 1, p.Key)
		dst = appendBytesField(dst, 2, p.Value)
	}
	if m.HasPartitionKey {
		dst = appendBytesField(dst, mdPartitionKey, m.PartitionKey)
	}
	if m.Compression != pulsarpb.CompressionType_NONE {
		dst = appendVarintField(dst, mdCompression, uint64(int64(m.Compression)))
	}
	dst = appendVarintField(dst, mdUncompressedSize, uint64(m.UncompressedSize))
	dst = appendVarintField(dst, mdNumMessagesInBatch, uint64(int64(m.NumMessagesInBatch)))
	if m.HasSchemaVersion {
		dst = appendBytesField(dst, mdSchemaVersion, m.SchemaVersion)
	}
	if m.HasPartitionKey && m.PartitionKeyB64Encoded {
		dst = appendBoolField(dst, mdPartitionKeyB64Encoded, true)
	}
	if m.HasOrderingKey {
		dst = appendBytesField(dst, mdOrderingKey, m.OrderingKey)
	}
	dst = appendVarintField(dst, mdHighestSequenceID, m.HighestSequenceID)
	if m.HasEntryHashRange {
		dst = appendVarintField(dst, mdEntryHashMin, uint64(m.EntryHashMin))
		dst = appendVarintField(dst, mdEntryHashMax, uint64(m.EntryHashMax))
	}
	return dst
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// AppendEntrySendFrame appends a SEND frame carrying an entry the proxy built: s, the metadata
// m and payload. It does not allocate when dst has room.
func AppendEntrySendFrame(dst []byte, s *Send, m *EntryMetadata, payload []byte) []byte {
	dst, start := beginFrame(dst)
	dst = appendSendCommand(dst, s)
	endCommand(dst, start)
	dst = binary.BigEndian.AppendUint16(dst, MagicChecksum)
	crcAt := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	mdAt := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = AppendEntryMetadata(dst, m)
	binary.BigEndian.PutUint32(dst[mdAt:], uint32(len(dst)-mdAt-4))
	dst = append(dst, payload...)
	binary.BigEndian.PutUint32(dst[crcAt:], CRC32C(dst[mdAt:]))
	endFrame(dst, start)
	return dst
}
