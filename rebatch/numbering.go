package rebatch

import (
	"bytes"
)

// Sequence ids. Broker de-duplication never reads the per-message sequence ids inside a batch:
// it judges each entry by its command ids alone (MessageDeduplication.isDuplicateNormal): an
// entry whose sequence_id is at or below the producer name's mark is a duplicate, and a new
// one moves the mark to max(sequence_id, highest_sequence_id). So the ids a client send may
// lend the entries built from it are those the broker would have recorded for it directly, its
// span [sequence_id, max(sequence_id, highest_sequence_id)], and, where the client numbers
// each message with an id of its own, those ids.
//
// Per-message ids are the send's own when they are consecutive (m, m+1, ..., m+n-1) and the
// command names the first or the last of them (Go, Java and C++ default batchers; C++ 3.4 to
// 4.0 name the last). Released clients give every message a fresh id from one counter, so no
// other send of theirs can carry an id inside that run, and the engine may cut such a send
// anywhere: each entry carries the ids of its first and last messages.
//
// Any other numbering (key-based batchers, whose batches interleave ids across keys; ids the
// application supplied; pulsar-client-go before v0.10, which numbers a batch as one id) is a
// span: the send may be merged whole with others, and cut only into as many pieces per broker
// producer as its span has ids. Piece k of a send on one broker producer carries id lo+k, its
// last piece lo+k..hi. The cut depends on the send alone (group changes, then max bytes and max
// messages from the piece's start), never on what the open batch already holds, so a resend is
// cut and numbered as the first attempt was and the broker's mark falls between pieces. A send
// needing more pieces than ids is forwarded as the client built it (Stats.SendsUnsplittable).
//
// A send whose command id is at or below an id this engine has already sent (ids below an
// earlier batch's highest, which a direct broker drops as duplicates) is not a resend: clients
// resend only on a new producer, which gets a new engine. The engine forwards it unchanged to
// the broker producer holding its highest id, so the broker judges it exactly as it would
// directly (Stats.SendsOutOfOrder).

// numbering is how one client send's messages are numbered, and the ids it may lend entries.
type numbering struct {
	perMessage bool   // every message owns its sequence id (see above)
	lo, hi     uint64 // perMessage: the first and last message's ids; else the command's span
}

// numberingOf classifies a send taken apart into msgs. atomic and mixed are explode's findings:
// no message has an id of its own, or only some do.
func numberingOf(sendSeq, sendHighest uint64, msgs []msgRef, atomic, mixed bool) numbering {
	span := numbering{lo: sendSeq, hi: max(sendSeq, sendHighest)}
	if atomic || mixed {
		return span
	}
	first, last := msgs[0].seq, msgs[len(msgs)-1].seq
	for i := range msgs {
		if msgs[i].seq != first+uint64(i) {
			return span
		}
	}
	switch {
	case sendSeq == first && (span.hi == sendSeq || span.hi == last), sendSeq == last && span.hi == sendSeq:
		return numbering{perMessage: true, lo: first, hi: last}
	}
	return span
}

// planned is where one message of the send being placed goes.
type planned struct {
	lane           int
	piece          int  // span sends: index in Producer.pieces
	start          bool // span sends: the first message of its piece
	groupLo, group int  // the message's group (routing class, properties): Producer.arena[groupLo:group]
	keyLo, keyHi   int  // buckets: its routing key, Producer.arena[keyLo:keyHi] (routing.go)
	hash           uint16
	hasHash        bool
}

// piece is a run of a span send's messages that goes into one entry whole.
type piece struct {
	lane           int
	groupLo, group int // arena offsets, as in planned
	bytes, count   int
	ord            uint64 // its place among the send's pieces on its lane: 0, 1, ...
	lo, hi         uint64
}

// plan decides each message's lane and group and, for a span send, cuts it into pieces and
// numbers them. It reports false when a span send needs more pieces on some broker producer
// than its span has ids. The results live in p.plan, p.pieces and p.arena until the next call.
func (p *Producer) planSend(msgs []msgRef, num numbering) bool {
	p.plan, p.pieces, p.arena = p.plan[:0], p.pieces[:0], p.arena[:0]
	if cap(p.current) < len(p.lanes) {
		p.current = make([]int, len(p.lanes))
	}
	current := p.current[:len(p.lanes)]
	for i := range current {
		current[i] = -1
	}
	for i := range msgs {
		m := &msgs[i]
		pm := planned{}
		p.classify(m, &pm)
		if !num.perMessage {
			need := 4 + len(m.smm) + len(m.payload)
			k := current[pm.lane]
			if k < 0 || p.pieces[k].bytes+need > p.budget || p.pieces[k].count >= p.cfg.Policy.MaxMessages ||
				!bytes.Equal(p.arena[p.pieces[k].groupLo:p.pieces[k].group], p.arena[pm.groupLo:pm.group]) {
				pc := piece{lane: pm.lane, groupLo: pm.groupLo, group: pm.group}
				if k >= 0 {
					pc.ord = p.pieces[k].ord + 1
				}
				if pc.ord > num.hi-num.lo {
					return false // more pieces on this lane than the span has ids
				}
				pc.lo, pc.hi = num.lo+pc.ord, num.lo+pc.ord
				p.pieces = append(p.pieces, pc)
				k = len(p.pieces) - 1
				current[pm.lane] = k
				pm.start = true
			}
			p.pieces[k].bytes += need
			p.pieces[k].count++
			pm.piece = k
		}
		p.plan = append(p.plan, pm)
	}
	// Each lane's last piece reaches the span's highest id.
	for _, k := range current {
		if k >= 0 && !num.perMessage {
			p.pieces[k].hi = num.hi
		}
	}
	return true
}
