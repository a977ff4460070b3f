package wire

import (
	"github.com/rebatchproxy/rebatchproxy/wire/internal/pbscan"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// The consumer-side commands a proxy-managed Key_Shared subscription follows (MESSAGE, FLOW,
// ACK, REDELIVER_UNACKNOWLEDGED_MESSAGES, CLOSE_CONSUMER), read without allocating. Each of
// them carries consumer_id as field 1 of its sub-command, whose field number in BaseCommand
// is the command's type.

// EntryID names a stored entry.
type EntryID struct{ Ledger, Entry uint64 }

// subCommand returns the body of cmd's sub-command of type t: its last occurrence, as a decoder
// keeps it (Frame.subCommand has it without the scan when the frame reader saw it).
func subCommand(cmd []byte, t pulsarpb.BaseCommand_Type) ([]byte, bool) {
	body, found, ok := pbscan.LastBytes(cmd, uint64(t))
	return body, ok && found
}

// ConsumerID reads consumer_id of a consumer command (MESSAGE, FLOW, ACK,
// REDELIVER_UNACKNOWLEDGED_MESSAGES, CLOSE_CONSUMER) from its command bytes
// (Frame.Command or Head.Command). ok is false for a malformed command or one
// without the field.
func ConsumerID(cmd []byte, t pulsarpb.BaseCommand_Type) (id uint64, ok bool) {
	body, ok := subCommand(cmd, t)
	if !ok {
		return 0, false
	}
	found := false
	for i := 0; i < len(body); {
		fl, n := pbscan.Next(body[i:])
		if n == 0 {
			return 0, false
		}
		i += n
		if fl.Num == 1 && fl.WireType == pbscan.Varint {
			id, found = fl.V, true
		}
	}
	return id, found
}

// MessageEntry reads the consumer and the entry of a MESSAGE command.
func MessageEntry(cmd []byte) (consumerID uint64, id EntryID, ok bool) {
	body, ok := subCommand(cmd, pulsarpb.BaseCommand_MESSAGE)
	if !ok {
		return 0, id, false
	}
	var hasC, hasID bool
	for i := 0; i < len(body); {
		fl, n := pbscan.Next(body[i:])
		if n == 0 {
			return 0, EntryID{}, false
		}
		i += n
		switch {
		case fl.Num == 1 && fl.WireType == pbscan.Varint:
			consumerID, hasC = fl.V, true
		case fl.Num == 2 && fl.WireType == pbscan.Bytes:
			id, _, hasID = messageID(fl.B)
		}
	}
	return consumerID, id, hasC && hasID
}

// messageID reads a MessageIdData: its entry, and whether it names part of a batch (ack_set,
// field 5, present: a batch-index acknowledgment).
func messageID(b []byte) (id EntryID, partial, ok bool) {
	var l, e bool
	for i := 0; i < len(b); {
		fl, n := pbscan.Next(b[i:])
		if n == 0 {
			return EntryID{}, false, false
		}
		i += n
		switch fl.Num {
		case 1:
			id.Ledger, l = fl.V, fl.WireType == pbscan.Varint
		case 2:
			id.Entry, e = fl.V, fl.WireType == pbscan.Varint
		case 5:
			partial = true
		}
	}
	return id, partial, l && e
}

// Acked reads an ACK or a REDELIVER_UNACKNOWLEDGED_MESSAGES: the consumer, and the entries
// it settles appended to dst (which it returns; no allocation once dst has room). For an
// ACK these are the whole entries acknowledged individually (a batch-index acknowledgment,
// with ack_set, settles no entry; a cumulative one returns cumulative true and no entries);
// for a REDELIVER, the entries handed back (all returns true when it names none: everything
// unacknowledged is handed back).
func Acked(f Frame, dst []EntryID) (consumerID uint64, ids []EntryID, cumulative, all, ok bool) {
	t := f.Type()
	idField := uint64(3) // CommandAck.message_id
	if t == pulsarpb.BaseCommand_REDELIVER_UNACKNOWLEDGED_MESSAGES {
		idField = 2 // CommandRedeliverUnacknowledgedMessages.message_ids
	} else if t != pulsarpb.BaseCommand_ACK {
		return 0, dst, false, false, false
	}
	body, ok := subCommand(f.Command(), t)
	if !ok {
		return 0, dst, false, false, false
	}
	ids = dst
	named := 0
	var hasC bool
	for i := 0; i < len(body); {
		fl, n := pbscan.Next(body[i:])
		if n == 0 {
			return 0, dst, false, false, false
		}
		i += n
		switch {
		case fl.Num == 1 && fl.WireType == pbscan.Varint:
			consumerID, hasC = fl.V, true
		case fl.Num == 2 && fl.WireType == pbscan.Varint && t == pulsarpb.BaseCommand_ACK:
			cumulative = fl.V == uint64(pulsarpb.CommandAck_Cumulative)
		case fl.Num == idField && fl.WireType == pbscan.Bytes:
			named++
			id, partial, idOK := messageID(fl.B)
			if idOK && !partial {
				ids = append(ids, id)
			}
		}
	}
	if cumulative {
		ids = ids[:len(dst)]
	}
	all = t == pulsarpb.BaseCommand_REDELIVER_UNACKNOWLEDGED_MESSAGES && named == 0
	return consumerID, ids, cumulative, all, hasC
}
