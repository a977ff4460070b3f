// Package batch splits and assembles Pulsar batch payloads.
//
// A batch entry (MessageMetadata.num_messages_in_batch present) carries,
// after decompression, the concatenation of its messages:
//
//	repeat num_messages_in_batch times:
//	    [smmSize:u32 big-endian][SingleMessageMetadata][payload_size bytes]
//
// Contract:
//   - Splitting never copies: Message.Metadata and Message.Payload alias the
//     batch buffer, which must stay unchanged while they are in use.
//   - The Iterator does not allocate; Split allocates only to grow its dst.
//   - Assembling from messages that came out of a split, in the same order,
//     reproduces the original buffer byte for byte.
//   - Walking is strict: the buffer must hold exactly the declared number of
//     records and nothing after them, otherwise ErrMalformed.
//   - Everything here is a pure function of its inputs: safe for concurrent
//     use on buffers the caller does not mutate.
//
// Compression is applied to the whole concatenated buffer; see package
// compression.
package batch

import (
	"encoding/binary"
	"errors"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// ErrMalformed means a batch buffer does not hold exactly the declared
// number of well-formed records.
var ErrMalformed = errors.New("batch: malformed batch payload")

// Message is one record of a batch: its encoded SingleMessageMetadata and
// its payload.
type Message struct {
	Metadata []byte
	Payload  []byte
}

// Iterator walks the records of an uncompressed batch buffer:
//
//	it := batch.NewIterator(buf, n)
//	for it.Next() {
//	    m, meta := it.Message(), it.Meta()
//	}
//	if err := it.Err(); err != nil { ... }
type Iterator struct {
	buf  []byte
	left int
	cur  Message
	meta SingleMeta
	err  error
}

// NewIterator returns an iterator over the n records of buf, where n is
// the entry's num_messages_in_batch.
func NewIterator(buf []byte, n int) Iterator {
	it := Iterator{buf: buf, left: n}
	if n < 0 {
		it.err = ErrMalformed
	}
	return it
}

// Next advances to the next record and reports whether there is one. It
// returns false at the end or on the first error; see Err.
func (it *Iterator) Next() bool {
	if it.err != nil {
		return false
	}
	if it.left == 0 {
		if len(it.buf) != 0 {
			it.err = ErrMalformed
		}
		return false
	}
	if len(it.buf) < 4 {
		it.err = ErrMalformed
		return false
	}
	size := uint64(binary.BigEndian.Uint32(it.buf))
	if size > uint64(len(it.buf)-4) {
		it.err = ErrMalformed
		return false
	}
	md := it.buf[4 : 4+size]
	meta, err := ParseSingleMeta(md)
	if err != nil || meta.PayloadSize < 0 || uint64(meta.PayloadSize) > uint64(len(it.buf))-4-size {
		it.err = ErrMalformed
		return false
	}
	end := 4 + int(size) + int(meta.PayloadSize)
	it.cur = Message{Metadata: md, Payload: it.buf[4+size : end]}
	it.meta = meta
	it.buf = it.buf[end:]
	it.left--
	return true
}

// Message returns the current record.
func (it *Iterator) Message() Message { return it.cur }

// Meta returns the parsed SingleMessageMetadata of the current record.
func (it *Iterator) Meta() SingleMeta { return it.meta }

// Err returns the first error met, or nil once every record was read.
func (it *Iterator) Err() error {
	if it.err == nil && it.left != 0 {
		return ErrMalformed
	}
	return it.err
}

// Split appends the n records of buf to dst.
func Split(dst []Message, buf []byte, n int) ([]Message, error) {
	start := len(dst)
	it := NewIterator(buf, n)
	for it.Next() {
		dst = append(dst, it.Message())
	}
	if err := it.Err(); err != nil {
		return dst[:start], err
	}
	return dst, nil
}

// AppendMessage appends one record to a batch buffer. m.Metadata must be an
// encoded SingleMessageMetadata whose payload_size equals len(m.Payload),
// as it is for a record taken from a split.
func AppendMessage(dst []byte, m Message) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(m.Metadata)))
	dst = append(dst, m.Metadata...)
	return append(dst, m.Payload...)
}

// Assemble appends the records of msgs, in order, to dst. The result holds
// len(msgs) records: set num_messages_in_batch to that.
func Assemble(dst []byte, msgs []Message) []byte {
	n := 0
	for _, m := range msgs {
		n += 4 + len(m.Metadata) + len(m.Payload)
	}
	dst = grow(dst, n)
	for _, m := range msgs {
		dst = AppendMessage(dst, m)
	}
	return dst
}

// AppendNewMessage encodes smm, with payload_size set to len(payload), and
// appends the record. smm is modified (its payload_size) but not retained.
func AppendNewMessage(dst []byte, smm *pulsarpb.SingleMessageMetadata, payload []byte) ([]byte, error) {
	smm.PayloadSize = proto.Int32(int32(len(payload)))
	at := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst, err := proto.MarshalOptions{AllowPartial: true}.MarshalAppend(dst, smm)
	if err != nil {
		return dst[:at], err
	}
	binary.BigEndian.PutUint32(dst[at:], uint32(len(dst)-at-4))
	return append(dst, payload...), nil
}

// DecodeSingleMeta fully decodes an encoded SingleMessageMetadata, keeping
// unknown fields and accepting a missing payload_size.
func DecodeSingleMeta(b []byte, smm *pulsarpb.SingleMessageMetadata) error {
	if err := (proto.UnmarshalOptions{AllowPartial: true}).Unmarshal(b, smm); err != nil {
		return ErrMalformed
	}
	return nil
}

// grow returns dst with capacity for n more bytes, same length.
func grow(dst []byte, n int) []byte {
	if cap(dst)-len(dst) >= n {
		return dst
	}
	out := make([]byte, len(dst), len(dst)+n)
	copy(out, dst)
	return out
}
