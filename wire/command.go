package wire

import (
	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire/internal/pbscan"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// decodeOpts keeps proto2 required-field checks off: the proxy forwards
// what a broker would accept and leaves rejecting to the broker.
var decodeOpts = proto.UnmarshalOptions{AllowPartial: true}

// encodeOpts likewise never fails on a missing required field, and keeps
// map-free output deterministic.
var encodeOpts = proto.MarshalOptions{AllowPartial: true, Deterministic: true}

// DecodeCommand fully decodes the frame's BaseCommand into cmd, replacing
// its contents. Fields unknown to pulsarpb are kept and re-encoded by
// AppendCommandFrame. Use it only for the commands a policy must inspect;
// forwarding needs Frame.Type alone.
func DecodeCommand(f Frame, cmd *pulsarpb.BaseCommand) error {
	if err := decodeOpts.Unmarshal(f.Command(), cmd); err != nil {
		return ErrMalformedCommand
	}
	return nil
}

// Send holds the CommandSend fields the proxy routes and rewrites by.
// Optional fields at their default value (zero, false, nil) are treated as
// absent by AppendSendFrame.
type Send struct {
	ProducerID  uint64
	SequenceID  uint64
	NumMessages int32 // 0 means absent, which the broker reads as 1
	// HasTxnID: the send belongs to a transaction (txnid_least_bits or
	// txnid_most_bits present). Presence is what the broker reads, not the
	// value: the first transaction of coordinator 0 is (0, 0).
	// AppendSendFrame writes both fields when it is set, and neither when not.
	HasTxnID          bool
	TxnIDLeastBits    uint64
	TxnIDMostBits     uint64
	HighestSequenceID uint64
	IsChunk           bool
	Marker            bool
	// MessageID is the encoded MessageIdData used only when replicating
	// to shadow topics; it aliases the frame's buffer.
	MessageID []byte
	// Unmodeled: the command has a field this type does not hold (a
	// newer client's, or a known one with another wire type), which
	// AppendSendFrame would not write: such a send must keep its bytes.
	Unmodeled bool
}

// ParseSend reads the CommandSend of a SEND frame without allocating.
// Fields it does not model are ignored. It returns ErrMalformedCommand when
// the frame is not a SEND or the command is malformed.
func ParseSend(f Frame) (Send, error) {
	var s Send
	err := ParseSendInto(f, &s)
	return s, err
}

// ParseSendInto is ParseSend writing into *s, for the hot path: a Send is too large to copy
// per message. *s is left zero on error.
func ParseSendInto(f Frame, s *Send) error {
	*s = Send{}
	if f.typ != pulsarpb.BaseCommand_SEND {
		return ErrMalformedCommand
	}
	body, ok := f.subCommand()
	if !ok {
		return ErrMalformedCommand
	}
	return parseSendBody(body, s)
}

// ParseSendHead is ParseSend for a frame of which only the Head has been
// read.
func ParseSendHead(h Head) (Send, error) {
	if h.Type != pulsarpb.BaseCommand_SEND {
		return Send{}, ErrMalformedCommand
	}
	body, ok := subCommand(h.Command, pulsarpb.BaseCommand_SEND)
	if !ok {
		return Send{}, ErrMalformedCommand
	}
	var s Send
	err := parseSendBody(body, &s)
	return s, err
}

// parseSendBody reads a CommandSend's fields into *s, which is zero; on error it leaves it zero.
func parseSendBody(body []byte, s *Send) error {
	for i := 0; i < len(body); {
		fl, n := pbscan.NextSmall(body[i:])
		if n == 0 {
			if fl, n = pbscan.Next(body[i:]); n == 0 {
				*s = Send{}
				return ErrMalformedCommand
			}
		}
		i += n
		switch {
		case fl.WireType == pbscan.Varint:
			switch fl.Num {
			case 1:
				s.ProducerID = fl.V
			case 2:
				s.SequenceID = fl.V
			case 3:
				s.NumMessages = int32(fl.V)
			case 4:
				s.TxnIDLeastBits, s.HasTxnID = fl.V, true
			case 5:
				s.TxnIDMostBits, s.HasTxnID = fl.V, true
			case 6:
				s.HighestSequenceID = fl.V
			case 7:
				s.IsChunk = fl.V != 0
			case 8:
				s.Marker = fl.V != 0
			default:
				s.Unmodeled = true
			}
		case fl.WireType == pbscan.Bytes && fl.Num == 9:
			s.MessageID = fl.B
		default:
			s.Unmodeled = true
		}
	}
	return nil
}

// SendReceipt holds a CommandSendReceipt. HasMessageID is false for a
// receipt without message_id.
type SendReceipt struct {
	ProducerID        uint64
	SequenceID        uint64
	HighestSequenceID uint64 // 0 means absent
	HasMessageID      bool
	LedgerID          uint64
	EntryID           uint64
}

// ParseSendReceipt reads the CommandSendReceipt of a SEND_RECEIPT frame
// without allocating. A broker acknowledges a de-duplicated send with
// ledger and entry 0xFFFFFFFFFFFFFFFF (-1 as int64).
func ParseSendReceipt(f Frame) (SendReceipt, error) {
	var r SendReceipt
	if f.typ != pulsarpb.BaseCommand_SEND_RECEIPT {
		return r, ErrMalformedCommand
	}
	body, ok := f.subCommand()
	if !ok {
		return r, ErrMalformedCommand
	}
	for i := 0; i < len(body); {
		fl, n := pbscan.Next(body[i:])
		if n == 0 {
			return SendReceipt{}, ErrMalformedCommand
		}
		i += n
		switch {
		case fl.WireType == pbscan.Varint && fl.Num == 1:
			r.ProducerID = fl.V
		case fl.WireType == pbscan.Varint && fl.Num == 2:
			r.SequenceID = fl.V
		case fl.WireType == pbscan.Varint && fl.Num == 4:
			r.HighestSequenceID = fl.V
		case fl.WireType == pbscan.Bytes && fl.Num == 3:
			r.HasMessageID = true
			for j := 0; j < len(fl.B); {
				g, m := pbscan.Next(fl.B[j:])
				if m == 0 {
					return SendReceipt{}, ErrMalformedCommand
				}
				j += m
				if g.WireType == pbscan.Varint && g.Num == 1 {
					r.LedgerID = g.V
				} else if g.WireType == pbscan.Varint && g.Num == 2 {
					r.EntryID = g.V
				}
			}
		}
	}
	return r, nil
}
