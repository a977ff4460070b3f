package wire

import (
	"encoding/binary"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire/internal/pbscan"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// The Append* functions write whole frames, size prefix included, to the
// end of dst and return the extended slice, like strconv.Append*. They
// allocate only when dst lacks capacity, and compute the CRC32C of every
// payload frame they write. They are pure functions: safe from any
// goroutine on a dst that goroutine owns.

// beginFrame reserves the 8-byte header and returns the frame's start.
func beginFrame(dst []byte) ([]byte, int) {
	return append(dst, 0, 0, 0, 0, 0, 0, 0, 0), len(dst)
}

// endCommand patches commandSize once the BaseCommand has been appended.
func endCommand(dst []byte, start int) {
	binary.BigEndian.PutUint32(dst[start+4:], uint32(len(dst)-start-frameHeaderLen))
}

// endFrame patches totalSize.
func endFrame(dst []byte, start int) {
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-4))
}

// AppendCommandFrame appends a simple frame holding cmd. Unknown fields
// kept from a decode are written back; required fields are not enforced.
func AppendCommandFrame(dst []byte, cmd *pulsarpb.BaseCommand) ([]byte, error) {
	dst, start := beginFrame(dst)
	dst, err := encodeOpts.MarshalAppend(dst, cmd)
	if err != nil {
		return dst[:start], err
	}
	endCommand(dst, start)
	endFrame(dst, start)
	return dst, nil
}

// AppendRawPayloadFrame appends a payload frame from already-encoded parts:
// a BaseCommand, an optional BrokerEntryMetadata (nil for none; only
// brokers send it), a MessageMetadata and the payload. The checksum block
// is always written, since the Go client rejects frames without it.
func AppendRawPayloadFrame(dst, command, brokerEntryMetadata, metadata, payload []byte) []byte {
	dst, start := beginFrame(dst)
	dst = append(dst, command...)
	endCommand(dst, start)
	dst = appendHeadersAndPayload(dst, brokerEntryMetadata, metadata, payload)
	endFrame(dst, start)
	return dst
}

func appendHeadersAndPayload(dst, brokerEntryMetadata, metadata, payload []byte) []byte {
	if brokerEntryMetadata != nil {
		dst = binary.BigEndian.AppendUint16(dst, MagicBrokerEntryMetadata)
		dst = binary.BigEndian.AppendUint32(dst, uint32(len(brokerEntryMetadata)))
		dst = append(dst, brokerEntryMetadata...)
	}
	dst = binary.BigEndian.AppendUint16(dst, MagicChecksum)
	crcAt := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(metadata)))
	dst = append(dst, metadata...)
	dst = append(dst, payload...)
	binary.BigEndian.PutUint32(dst[crcAt:], CRC32C(dst[crcAt+4:]))
	return dst
}

// AppendPayloadFrame appends a payload frame whose command and metadata are
// encoded from the given messages.
func AppendPayloadFrame(dst []byte, cmd *pulsarpb.BaseCommand, md *pulsarpb.MessageMetadata, payload []byte) ([]byte, error) {
	dst, start := beginFrame(dst)
	dst, err := encodeOpts.MarshalAppend(dst, cmd)
	if err != nil {
		return dst[:start], err
	}
	endCommand(dst, start)
	dst, err = appendMetadataAndPayload(dst, md, payload)
	if err != nil {
		return dst[:start], err
	}
	endFrame(dst, start)
	return dst, nil
}

// appendMetadataAndPayload writes [0x0e01][crc][mdSize][md][payload],
// encoding md straight into dst.
func appendMetadataAndPayload(dst []byte, md *pulsarpb.MessageMetadata, payload []byte) ([]byte, error) {
	dst = binary.BigEndian.AppendUint16(dst, MagicChecksum)
	crcAt := len(dst)
	dst = append(dst, 0, 0, 0, 0, 0, 0, 0, 0)
	dst, err := encodeOpts.MarshalAppend(dst, md)
	if err != nil {
		return dst, err
	}
	binary.BigEndian.PutUint32(dst[crcAt+4:], uint32(len(dst)-crcAt-8))
	dst = append(dst, payload...)
	binary.BigEndian.PutUint32(dst[crcAt:], CRC32C(dst[crcAt+4:]))
	return dst, nil
}

// appendSendCommand hand-encodes BaseCommand{type: SEND, send: s}, writing
// optional fields only when they differ from their defaults.
func appendSendCommand(dst []byte, s *Send) []byte {
	n := 1 + pbscan.VarintLen(s.ProducerID) + 1 + pbscan.VarintLen(s.SequenceID)
	if s.NumMessages != 0 {
		n += 1 + pbscan.VarintLen(uint64(int64(s.NumMessages)))
	}
	if s.HasTxnID {
		n += 2 + pbscan.VarintLen(s.TxnIDLeastBits) + pbscan.VarintLen(s.TxnIDMostBits)
	}
	if s.HighestSequenceID != 0 {
		n += 1 + pbscan.VarintLen(s.HighestSequenceID)
	}
	if s.IsChunk {
		n += 2
	}
	if s.Marker {
		n += 2
	}
	if s.MessageID != nil {
		n += 1 + pbscan.VarintLen(uint64(len(s.MessageID))) + len(s.MessageID)
	}
	dst = append(dst, 1<<3|pbscan.Varint, byte(pulsarpb.BaseCommand_SEND)) // type < 128: one-byte varint
	dst = pbscan.AppendTag(dst, uint64(pulsarpb.BaseCommand_SEND), pbscan.Bytes)
	dst = pbscan.AppendVarint(dst, uint64(n))
	dst = pbscan.AppendTag(dst, 1, pbscan.Varint)
	dst = pbscan.AppendVarint(dst, s.ProducerID)
	dst = pbscan.AppendTag(dst, 2, pbscan.Varint)
	dst = pbscan.AppendVarint(dst, s.SequenceID)
	if s.NumMessages != 0 {
		dst = pbscan.AppendTag(dst, 3, pbscan.Varint)
		dst = pbscan.AppendVarint(dst, uint64(int64(s.NumMessages)))
	}
	if s.HasTxnID { // both, as clients send them: the broker reads a transaction only when both are present
		dst = pbscan.AppendTag(dst, 4, pbscan.Varint)
		dst = pbscan.AppendVarint(dst, s.TxnIDLeastBits)
		dst = pbscan.AppendTag(dst, 5, pbscan.Varint)
		dst = pbscan.AppendVarint(dst, s.TxnIDMostBits)
	}
	if s.HighestSequenceID != 0 {
		dst = pbscan.AppendTag(dst, 6, pbscan.Varint)
		dst = pbscan.AppendVarint(dst, s.HighestSequenceID)
	}
	if s.IsChunk {
		dst = append(dst, 7<<3|pbscan.Varint, 1)
	}
	if s.Marker {
		dst = append(dst, 8<<3|pbscan.Varint, 1)
	}
	if s.MessageID != nil {
		dst = pbscan.AppendTag(dst, 9, pbscan.Bytes)
		dst = pbscan.AppendVarint(dst, uint64(len(s.MessageID)))
		dst = append(dst, s.MessageID...)
	}
	return dst
}

// AppendSendFrame appends a SEND frame with already-encoded metadata. It
// does not allocate when dst has room: the hot path for forwarding a
// rebuilt batch.
func AppendSendFrame(dst []byte, s *Send, metadata, payload []byte) []byte {
	dst, start := beginFrame(dst)
	dst = appendSendCommand(dst, s)
	endCommand(dst, start)
	dst = appendHeadersAndPayload(dst, nil, metadata, payload)
	endFrame(dst, start)
	return dst
}

// AppendSendFrameMetadata appends a SEND frame, encoding md directly into
// dst (no intermediate metadata buffer).
func AppendSendFrameMetadata(dst []byte, s *Send, md *pulsarpb.MessageMetadata, payload []byte) ([]byte, error) {
	dst, start := beginFrame(dst)
	dst = appendSendCommand(dst, s)
	endCommand(dst, start)
	dst, err := appendMetadataAndPayload(dst, md, payload)
	if err != nil {
		return dst[:start], err
	}
	endFrame(dst, start)
	return dst, nil
}

// AppendSendReceiptFrame appends a SEND_RECEIPT frame. A zero
// HighestSequenceID is omitted; the message id is written when
// HasMessageID is set.
func AppendSendReceiptFrame(dst []byte, r *SendReceipt) []byte {
	idLen := 0
	if r.HasMessageID {
		idLen = 1 + pbscan.VarintLen(r.LedgerID) + 1 + pbscan.VarintLen(r.EntryID)
	}
	n := 1 + pbscan.VarintLen(r.ProducerID) + 1 + pbscan.VarintLen(r.SequenceID)
	if r.HasMessageID {
		n += 1 + pbscan.VarintLen(uint64(idLen)) + idLen
	}
	if r.HighestSequenceID != 0 {
		n += 1 + pbscan.VarintLen(r.HighestSequenceID)
	}
	dst, start := beginFrame(dst)
	dst = append(dst, 1<<3|pbscan.Varint, byte(pulsarpb.BaseCommand_SEND_RECEIPT))
	dst = pbscan.AppendTag(dst, uint64(pulsarpb.BaseCommand_SEND_RECEIPT), pbscan.Bytes)
	dst = pbscan.AppendVarint(dst, uint64(n))
	dst = pbscan.AppendTag(dst, 1, pbscan.Varint)
	dst = pbscan.AppendVarint(dst, r.ProducerID)
	dst = pbscan.AppendTag(dst, 2, pbscan.Varint)
	dst = pbscan.AppendVarint(dst, r.SequenceID)
	if r.HasMessageID {
		dst = pbscan.AppendTag(dst, 3, pbscan.Bytes)
		dst = pbscan.AppendVarint(dst, uint64(idLen))
		dst = pbscan.AppendTag(dst, 1, pbscan.Varint)
		dst = pbscan.AppendVarint(dst, r.LedgerID)
		dst = pbscan.AppendTag(dst, 2, pbscan.Varint)
		dst = pbscan.AppendVarint(dst, r.EntryID)
	}
	if r.HighestSequenceID != 0 {
		dst = pbscan.AppendTag(dst, 4, pbscan.Varint)
		dst = pbscan.AppendVarint(dst, r.HighestSequenceID)
	}
	endCommand(dst, start)
	endFrame(dst, start)
	return dst
}

// AppendSendErrorFrame appends a SEND_ERROR frame.
func AppendSendErrorFrame(dst []byte, producerID, sequenceID uint64, code pulsarpb.ServerError, message string) []byte {
	n := 1 + pbscan.VarintLen(producerID) + 1 + pbscan.VarintLen(sequenceID) +
		1 + pbscan.VarintLen(uint64(code)) + 1 + pbscan.VarintLen(uint64(len(message))) + len(message)
	dst, start := beginFrame(dst)
	dst = append(dst, 1<<3|pbscan.Varint, byte(pulsarpb.BaseCommand_SEND_ERROR))
	dst = pbscan.AppendTag(dst, uint64(pulsarpb.BaseCommand_SEND_ERROR), pbscan.Bytes)
	dst = pbscan.AppendVarint(dst, uint64(n))
	dst = pbscan.AppendTag(dst, 1, pbscan.Varint)
	dst = pbscan.AppendVarint(dst, producerID)
	dst = pbscan.AppendTag(dst, 2, pbscan.Varint)
	dst = pbscan.AppendVarint(dst, sequenceID)
	dst = pbscan.AppendTag(dst, 3, pbscan.Varint)
	dst = pbscan.AppendVarint(dst, uint64(code))
	dst = pbscan.AppendTag(dst, 4, pbscan.Bytes)
	dst = pbscan.AppendVarint(dst, uint64(len(message)))
	dst = append(dst, message...)
	endCommand(dst, start)
	endFrame(dst, start)
	return dst
}

// AppendPingFrame appends a PING frame.
func AppendPingFrame(dst []byte) []byte {
	return appendEmptyCommandFrame(dst, pulsarpb.BaseCommand_PING)
}

// AppendPongFrame appends a PONG frame.
func AppendPongFrame(dst []byte) []byte {
	return appendEmptyCommandFrame(dst, pulsarpb.BaseCommand_PONG)
}

// appendEmptyCommandFrame writes BaseCommand{type: t, <t>: {}}.
func appendEmptyCommandFrame(dst []byte, t pulsarpb.BaseCommand_Type) []byte {
	dst, start := beginFrame(dst)
	dst = pbscan.AppendTag(dst, 1, pbscan.Varint)
	dst = pbscan.AppendVarint(dst, uint64(t))
	dst = pbscan.AppendTag(dst, uint64(t), pbscan.Bytes)
	dst = append(dst, 0)
	endCommand(dst, start)
	endFrame(dst, start)
	return dst
}

// compile-time check that the generated types satisfy proto.Message.
var _ proto.Message = (*pulsarpb.BaseCommand)(nil)
