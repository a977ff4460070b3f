package route

import (
	"errors"
	"strconv"
)

// KeyFields are the MessageMetadata fields that decide a message's key, as
// plain values so that route stays free of wire types. A Has* flag is the
// protobuf field's presence: an empty but present key is still a key.
type KeyFields struct {
	OrderingKey     []byte
	HasOrderingKey  bool
	PartitionKey    string
	HasPartitionKey bool
	// PartitionKeyB64 is MessageMetadata.partition_key_b64_encoded.
	PartitionKeyB64 bool

	// ProducerName and SequenceID feed the broker's fallback key (Pulsar >= 4.0)
	// in StickyKey only; MessageKey ignores them.
	ProducerName    string
	HasProducerName bool
	SequenceID      uint64
	HasSequenceID   bool
}

// ErrBadBase64Key reports a partition key flagged base64 that does not decode.
var ErrBadBase64Key = errors.New("route: partition key is flagged base64 but does not decode")

// noneKey is the broker's key of last resort (Commands.NONE_KEY).
var noneKey = []byte("NONE_KEY")

// MessageKey returns the key hashB is computed from (PIP-486): the ordering key
// if present, else the partition key (base64-decoded when flagged, else its
// UTF-8 bytes). ok is false when the message has neither. The returned slice
// may alias f.OrderingKey; a partition key is read by AppendPartitionKey into
// a new slice. Any goroutine may call it.
func MessageKey(f KeyFields) (key []byte, ok bool, err error) {
	switch {
	case f.HasOrderingKey:
		return f.OrderingKey, true, nil
	case f.HasPartitionKey:
		b, err := AppendPartitionKey(nil, []byte(f.PartitionKey), f.PartitionKeyB64)
		if err != nil {
			return nil, false, err
		}
		return b, true, nil
	}
	return nil, false, nil
}

// StickyKey returns the key the broker hashes to dispatch an entry on a
// Key_Shared subscription, following Commands.resolveStickyKey and
// peekStickyKey of Pulsar 4.0.8: MessageKey's key if any, else
// "<producer_name>-<sequence_id>" (sequence id printed as a signed Java long),
// else "NONE_KEY". A partition key flagged base64 that fails to decode makes
// the broker log an error and use "NONE_KEY"; so does this function.
// Any goroutine may call it.
func StickyKey(f KeyFields) []byte {
	key, ok, err := MessageKey(f)
	switch {
	case err != nil:
		return noneKey
	case ok:
		return key
	case f.HasProducerName && f.HasSequenceID:
		return []byte(f.ProducerName + "-" + strconv.FormatInt(int64(f.SequenceID), 10))
	}
	return noneKey
}

// HashB is PIP-486's hashB: the low 16 bits of Murmur3 x86_32 (seed 0) of the
// message key. Clearing the sign bit, as the broker's makeHash does, cannot
// change the low 16 bits. It does not allocate. Any goroutine may call it.
func HashB(key []byte) uint16 {
	return uint16(Murmur3x86_32(key, 0))
}
