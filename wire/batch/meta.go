package batch

import "github.com/rebatchproxy/rebatchproxy/wire/internal/pbscan"

// SingleMeta is an allocation-free view of an encoded
// SingleMessageMetadata: scalar fields are decoded, byte fields alias the
// buffer, and properties are walked on demand. Booleans and integers read
// as their proto default when absent; the Has* fields tell presence where
// the routing code needs it.
type SingleMeta struct {
	raw                    []byte
	PayloadSize            int32
	PartitionKey           []byte
	HasPartitionKey        bool
	PartitionKeyB64Encoded bool
	OrderingKey            []byte
	HasOrderingKey         bool
	EventTime              uint64
	SequenceID             uint64
	HasSequenceID          bool
	CompactedOut           bool
	NullValue              bool
	NullPartitionKey       bool
	NumProperties          int
	// propsLo and propsHi span the property fields in raw, from the first's
	// start to the last's end (PropertiesRaw).
	propsLo, propsHi int
}

// Field numbers of SingleMessageMetadata (see pulsar_api.proto).
const (
	smmProperties       = 1
	smmPartitionKey     = 2
	smmPayloadSize      = 3
	smmCompactedOut     = 4
	smmEventTime        = 5
	smmPartitionKeyB64  = 6
	smmOrderingKey      = 7
	smmSequenceID       = 8
	smmNullValue        = 9
	smmNullPartitionKey = 10
)

// ParseSingleMeta decodes the fields of an encoded SingleMessageMetadata
// without allocating. payload_size is required (the batch cannot be walked
// without it); its absence or a malformed encoding is ErrMalformed. Fields
// with an unexpected wire type are skipped, as a protobuf decoder keeps
// them as unknown fields.
func ParseSingleMeta(b []byte) (SingleMeta, error) {
	m := SingleMeta{raw: b}
	hasSize := false
	for i := 0; i < len(b); {
		f, n := pbscan.NextSmall(b[i:]) // inlined: it runs per message of every batch
		if n == 0 {
			if f, n = pbscan.Next(b[i:]); n == 0 {
				return SingleMeta{}, ErrMalformed
			}
		}
		i += n
		switch f.WireType {
		case pbscan.Varint:
			switch f.Num {
			case smmPayloadSize:
				m.PayloadSize, hasSize = int32(f.V), true
			case smmCompactedOut:
				m.CompactedOut = f.V != 0
			case smmEventTime:
				m.EventTime = f.V
			case smmPartitionKeyB64:
				m.PartitionKeyB64Encoded = f.V != 0
			case smmSequenceID:
				m.SequenceID, m.HasSequenceID = f.V, true
			case smmNullValue:
				m.NullValue = f.V != 0
			case smmNullPartitionKey:
				m.NullPartitionKey = f.V != 0
			}
		case pbscan.Bytes:
			switch f.Num {
			case smmProperties:
				if m.NumProperties == 0 {
					m.propsLo = i - n
				}
				m.NumProperties++
				m.propsHi = i
			case smmPartitionKey:
				m.PartitionKey, m.HasPartitionKey = f.B, true
			case smmOrderingKey:
				m.OrderingKey, m.HasOrderingKey = f.B, true
			}
		}
	}
	if !hasSize {
		return SingleMeta{}, ErrMalformed
	}
	return m, nil
}

// SetRaw makes m, whose fields a caller filled from what it encoded raw from
// (wire.SendMetadata.FillSingleMeta, for a message sent alone), what ParseSingleMeta(raw) would
// return, without reading raw: its property fields come first, in raw[:propsLen]. The engine then
// reads each message's metadata once. The caller vouches that the fields are what raw encodes,
// and its tests hold it to that. It fills m in place: the view is too large to copy per message.
func (m *SingleMeta) SetRaw(raw []byte, propsLen int) {
	m.raw, m.propsLo, m.propsHi = raw, 0, propsLen
}

// PropertiesRaw returns the encoded bytes from the first property field to the end of the last
// (empty without properties). Two messages whose PropertiesRaw are equal have the same
// properties in the same order, so a caller may key what it derives from the properties on it.
func (m SingleMeta) PropertiesRaw() []byte { return m.raw[m.propsLo:m.propsHi] }

// Key returns the key Key_Shared routing hashes for this message: the
// ordering key when set, else the partition key (still base64 text when
// PartitionKeyB64Encoded; decoding it is the caller's choice).
func (m SingleMeta) Key() []byte {
	if m.HasOrderingKey {
		return m.OrderingKey
	}
	return m.PartitionKey
}

// Raw returns the encoded SingleMessageMetadata the view was parsed from.
func (m SingleMeta) Raw() []byte { return m.raw }

// Properties calls fn for each property in order until fn returns false.
// The slices alias the buffer. A malformed property ends the walk early
// with ErrMalformed. The walk stops after the NumProperties-th property: the
// fields after it are not read (on the rewriting path they are most of them).
func (m SingleMeta) Properties(fn func(key, value []byte) bool) error {
	b := m.raw
	for i, left := 0, m.NumProperties; i < len(b) && left > 0; {
		f, n := pbscan.Next(b[i:])
		if n == 0 {
			return ErrMalformed
		}
		i += n
		if f.Num != smmProperties || f.WireType != pbscan.Bytes {
			continue
		}
		left--
		k, v, ok := parseKeyValue(f.B)
		if !ok {
			return ErrMalformed
		}
		if !fn(k, v) {
			return nil
		}
	}
	return nil
}

// Property returns the value of the first property named key.
func (m SingleMeta) Property(key string) (value []byte, ok bool) {
	_ = m.Properties(func(k, v []byte) bool {
		if string(k) == key {
			value, ok = v, true
			return false
		}
		return true
	})
	return value, ok
}

// parseKeyValue decodes a KeyValue message (key=1, value=2; both strings;
// the last occurrence wins, as in any decoder).
func parseKeyValue(b []byte) (k, v []byte, ok bool) {
	for i := 0; i < len(b); {
		f, n := pbscan.Next(b[i:])
		if n == 0 {
			return nil, nil, false
		}
		i += n
		if f.WireType != pbscan.Bytes {
			continue
		}
		switch f.Num {
		case 1:
			k = f.B
		case 2:
			v = f.B
		}
	}
	return k, v, true
}

// MaxSequenceIDLen is the most AppendWithSequenceID adds to a metadata.
const MaxSequenceIDLen = 1 + 10

// AppendWithSequenceID appends raw, an encoded SingleMessageMetadata without a sequence_id,
// followed by sequence_id = seq: it parses as raw with that field set.
func AppendWithSequenceID(dst, raw []byte, seq uint64) []byte {
	dst = append(dst, raw...)
	dst = pbscan.AppendTag(dst, smmSequenceID, pbscan.Varint)
	return pbscan.AppendVarint(dst, seq)
}
