package wire

import (
	"encoding/binary"

	"github.com/rebatchproxy/rebatchproxy/wire/batch"
	"github.com/rebatchproxy/rebatchproxy/wire/internal/pbscan"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// Field numbers of MessageMetadata the rewriting path reads or writes.
const (
	mdProducerName           = 1
	mdSequenceID             = 2
	mdPublishTime            = 3
	mdProperties             = 4
	mdPartitionKey           = 6
	mdCompression            = 8
	mdUncompressedSize       = 9
	mdNumMessagesInBatch     = 11
	mdEventTime              = 12
	mdSchemaVersion          = 16
	mdPartitionKeyB64Encoded = 17
	mdOrderingKey            = 18
	mdHighestSequenceID      = 24
	mdNullValue              = 25
	mdNullPartitionKey       = 30
	mdCompactedBatchIndexes  = 31
	mdEntryHashMin           = 33
	mdEntryHashMax           = 34
)

// Field numbers of SingleMessageMetadata.
const (
	smmProperties             = 1
	smmPartitionKey           = 2
	smmPayloadSize            = 3
	smmEventTime              = 5
	smmPartitionKeyB64Encoded = 6
	smmOrderingKey            = 7
	smmSequenceID             = 8
	smmNullValue              = 9
	smmNullPartitionKey       = 10
)

// SendMetadata is what the rewriting path needs of a SEND's MessageMetadata, read from its
// encoding in one pass without allocating (ParseSendMetadata): the fields that decide whether
// and how the send may be merged, and, for a message sent alone, where its own fields are, so
// that AppendSingleMetadata can move them into the SingleMessageMetadata a batch gives it.
//
// It reads the encoding as the protobuf runtime decodes it: for a field given more than once
// the last occurrence counts, a known field with an unexpected wire type is an unknown field,
// and unknown fields are skipped. Byte fields alias the scanned buffer.
type SendMetadata struct {
	raw []byte

	SequenceID       uint64
	PublishTime      uint64
	HasPublishTime   bool
	Compression      pulsarpb.CompressionType
	UncompressedSize uint32
	// NumMessagesInBatch is set when Batched: the payload is in batch format.
	NumMessagesInBatch int32
	Batched            bool
	SchemaVersion      []byte
	HasSchemaVersion   bool
	// Special is true when the message must travel alone and unchanged (DESIGN.md section 2):
	// a chunk, an encrypted, delayed, marker, replicated or transactional message, one with a
	// schema id or an entry hash range of its own, a codec this build does not know, or any
	// field this build does not know (or one with a wire type the runtime would keep as
	// unknown): an entry the proxy builds would not carry it, so the message keeps its own.
	Special bool

	// The fields of a message sent alone that move into its SingleMessageMetadata.
	partitionKey, orderingKey  []byte
	hasPartitionKey            bool
	hasOrderingKey             bool
	eventTime                  uint64
	hasEventTime               bool
	b64, nullValue, nullPK     bool
	hasB64, hasNull, hasNullPK bool
	properties                 int // occurrences of properties
	// propLo and propHi span the property fields in raw (first start, last end);
	// smmPropBytes is what they take once written as SingleMessageMetadata fields.
	propLo, propHi, smmPropBytes int
}

// ParseSendMetadata reads the encoded MessageMetadata b (Frame.Metadata) into m, replacing its
// contents. It returns ErrMalformedMetadata when b, or a property in it, is not well-formed
// protobuf. Missing required fields are accepted, as a broker would.
func ParseSendMetadata(b []byte, m *SendMetadata) error {
	*m = SendMetadata{raw: b}
	for rest := b; len(rest) > 0; {
		f, n := pbscan.NextSmall(rest)
		if n == 0 {
			if f, n = pbscan.Next(rest); n == 0 {
				return ErrMalformedMetadata
			}
		}
		rest = rest[n:]
		if f.WireType == pbscan.Bytes {
			switch f.Num {
			case mdProperties:
				if !wellFormed(f.B) {
					return ErrMalformedMetadata
				}
				at := len(b) - len(rest)
				if m.properties == 0 {
					m.propLo = at - n
				}
				m.properties++
				m.propHi = at
				m.smmPropBytes += 1 + uvarintLen(uint64(len(f.B))) + len(f.B) // tag of field 1, length, bytes
			case mdPartitionKey:
				m.partitionKey, m.hasPartitionKey = f.B, true
			case mdOrderingKey:
				m.orderingKey, m.hasOrderingKey = f.B, true
			case mdSchemaVersion:
				m.SchemaVersion, m.HasSchemaVersion = f.B, true
			case mdCompactedBatchIndexes:
				// Packed varints, which the runtime reads (and refuses when truncated).
				if !packedVarints(f.B) {
					return ErrMalformedMetadata
				}
			case mdProducerName:
				// The entry's producer is the proxy's; the name is the same.
			default: // replicated, encrypted, a chunk's uuid, a schema id, or a field this build does not know
				m.Special = true
			}
			continue
		}
		if f.WireType != pbscan.Varint {
			m.Special = true // a field this build does not know, or a known one the runtime would keep as unknown
			continue
		}
		switch f.Num {
		case mdSequenceID:
			m.SequenceID = f.V
		case mdPublishTime:
			m.PublishTime, m.HasPublishTime = f.V, true
		case mdCompression:
			m.Compression = pulsarpb.CompressionType(int32(f.V))
		case mdUncompressedSize:
			m.UncompressedSize = uint32(f.V)
		case mdNumMessagesInBatch:
			m.NumMessagesInBatch, m.Batched = int32(f.V), true
		case mdEventTime:
			m.eventTime, m.hasEventTime = f.V, true
		case mdPartitionKeyB64Encoded:
			m.b64, m.hasB64 = f.V != 0, true
		case mdNullValue:
			m.nullValue, m.hasNull = f.V != 0, true
		case mdNullPartitionKey:
			m.nullPK, m.hasNullPK = f.V != 0, true
		case mdHighestSequenceID:
			// Renumbered with the entry (rebatch).
		case mdCompactedBatchIndexes:
			// Unpacked, as the runtime also reads a repeated scalar; set by compaction only.
		default: // delayed, a marker, a transaction, a chunk, a hash range the client set, or a field this build does not know
			m.Special = true
		}
	}
	if c := m.Compression; c < 0 || int(c) >= len(knownCodecs) || !knownCodecs[c] {
		m.Special = true
	}
	return nil
}

// knownCodecs[c] is true for the compression types of this build's pulsar_api.proto (indexed by
// value, read per send without the map's lookup). A codec the table has no room for is unknown.
var knownCodecs = func() (known [16]bool) {
	for v := range pulsarpb.CompressionType_name {
		if v >= 0 && int(v) < len(known) {
			known[v] = true
		}
	}
	return known
}()

// wellFormed reports whether b is a well-formed protobuf message.
func wellFormed(b []byte) bool {
	for len(b) > 0 {
		_, n := pbscan.NextSmall(b) // inlined: it runs per property of every send
		if n == 0 {
			if _, n = pbscan.Next(b); n == 0 {
				return false
			}
		}
		b = b[n:]
	}
	return true
}

// packedVarints reports whether b is a sequence of whole varints.
func packedVarints(b []byte) bool {
	for len(b) > 0 {
		_, n := pbscan.Uvarint(b)
		if n == 0 {
			return false
		}
		b = b[n:]
	}
	return true
}

// AppendSingleMetadata appends the SingleMessageMetadata of a message sent alone, as a batch
// carries it: its properties, keys, event time and null markers moved from the outer metadata
// m was parsed from (which must be unchanged), its sequence id and payloadSize. Fields are
// written in field-number order, as the protobuf runtime writes them deterministically. It does
// not allocate when dst has room.
func (m *SendMetadata) AppendSingleMetadata(dst []byte, payloadSize int) []byte {
	if m.properties > 0 {
		for rest := m.raw[m.propLo:m.propHi]; len(rest) > 0; {
			f, n := pbscan.NextSmall(rest) // inlined: it runs per property of every send
			if n == 0 {
				f, n = pbscan.Next(rest) // well-formed: ParseSendMetadata read it
			}
			rest = rest[n:]
			if f.Num == mdProperties && f.WireType == pbscan.Bytes {
				dst = appendBytesField(dst, smmProperties, f.B)
			}
		}
	}
	if m.hasPartitionKey {
		dst = appendBytesField(dst, smmPartitionKey, m.partitionKey)
	}
	dst = appendVarintField(dst, smmPayloadSize, uint64(int64(int32(payloadSize))))
	if m.hasEventTime {
		dst = appendVarintField(dst, smmEventTime, m.eventTime)
	}
	if m.hasB64 {
		dst = appendBoolField(dst, smmPartitionKeyB64Encoded, m.b64)
	}
	if m.hasOrderingKey {
		dst = appendBytesField(dst, smmOrderingKey, m.orderingKey)
	}
	dst = appendVarintField(dst, smmSequenceID, m.SequenceID)
	if m.hasNull {
		dst = appendBoolField(dst, smmNullValue, m.nullValue)
	}
	if m.hasNullPK {
		dst = appendBoolField(dst, smmNullPartitionKey, m.nullPK)
	}
	return dst
}

// FillSingleMeta sets *dst to what batch.ParseSingleMeta reads from smm, the result of
// AppendSingleMetadata(dst, payloadSize), without reading it: the fields it was encoded from.
// It writes in place because the engine fills one per message.
func (m *SendMetadata) FillSingleMeta(dst *batch.SingleMeta, smm []byte, payloadSize int) {
	*dst = batch.SingleMeta{
		PayloadSize:            int32(payloadSize),
		HasPartitionKey:        m.hasPartitionKey,
		PartitionKeyB64Encoded: m.hasB64 && m.b64,
		HasOrderingKey:         m.hasOrderingKey,
		SequenceID:             m.SequenceID,
		HasSequenceID:          true,
		NullValue:              m.hasNull && m.nullValue,
		NullPartitionKey:       m.hasNullPK && m.nullPK,
		NumProperties:          m.properties,
	}
	if m.hasPartitionKey {
		dst.PartitionKey = m.partitionKey
	}
	if m.hasOrderingKey {
		dst.OrderingKey = m.orderingKey
	}
	if m.hasEventTime {
		dst.EventTime = m.eventTime
	}
	// AppendSingleMetadata writes the properties first.
	dst.SetRaw(smm, m.smmPropBytes)
}

func appendVarintField(dst []byte, num, v uint64) []byte {
	dst = binary.AppendUvarint(dst, num<<3|pbscan.Varint)
	return binary.AppendUvarint(dst, v)
}

func appendBoolField(dst []byte, num uint64, v bool) []byte {
	b := uint64(0)
	if v {
		b = 1
	}
	return appendVarintField(dst, num, b)
}

// appendBytesField appends a length-delimited field: a bytes or string value, or an encoded
// message.
func appendBytesField[T ~[]byte | ~string](dst []byte, num uint64, v T) []byte {
	dst = binary.AppendUvarint(dst, num<<3|pbscan.Bytes)
	dst = binary.AppendUvarint(dst, uint64(len(v)))
	return append(dst, v...)
}
