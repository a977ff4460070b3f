package rebatch

import (
	"time"

	"github.com/rebatchproxy/rebatchproxy/wire"
)

// Out-of-order sends: a client send numbered at or below an id the engine already sent as new
// (application-supplied ids, Java's sequenceId(...), that go down) is one a direct broker judges
// against the highest id it has seen from the producer. The engine forwards it as the client
// built it on its broker producer with the highest mark, so the broker compares it with the
// same mark.
//
// One difference remains if it is sent at once: directly, the higher send has usually been
// stored by the time the lower one arrives; through the engine it has often only just been
// written (the engine batches, and bucket lanes run side by side). The broker then answers
// "cannot determine whether the message is a duplicate" (its id lies between the producer's
// persisted and pushed marks), every released client closes its connection on that error and
// resends everything pending, and a new engine cannot tell those resends from sends it had cut
// across bucket producers and must complete, so it judges them per bucket and stores some that
// a direct broker drops. So the send is held until the broker can judge it: until its lane's
// persisted mark (raised by each stored entry's receipt) reaches the send's id, or nothing is
// left in flight there, or the lane reports an error. It keeps its place in the client's queue,
// so receipts still leave in order; only its own write waits, for at most the entries already
// in flight ahead of it.

// dupLedger is the ledger id of the broker's receipt for a duplicate (-1:-1).
const dupLedger = ^uint64(0)

// heldVerbatim is an out-of-order client send waiting for its lane (see above).
type heldVerbatim struct {
	id    uint64 // the client send
	send  wire.Send
	frame []byte // the SEND frame, addressed to the lane
}

// outOfOrder forwards an out-of-order send on the lane with the highest mark, at once when the
// broker can judge it, else once it can (releaseWaiting).
func (p *Producer) outOfOrder(now time.Time, f wire.Frame, s *wire.Send, out *Output) error {
	if err := p.flushAll(out); err != nil {
		return err
	}
	l := p.highestLane()
	id := p.queueVerbatim(now, s)
	if len(l.waiting) == 0 && !l.undecidable(s.SequenceID) {
		out.Broker = appendOnLane(out.Broker, f, s, l)
		p.sentVerbatim(l, id, s)
		return nil
	}
	p.stats.SendsHeldForMark++
	h := heldVerbatim{id: id, send: *s, frame: appendOnLane(nil, f, s, l)}
	h.send.ProducerID = l.producerID
	l.waiting = append(l.waiting, h)
	return nil
}

// undecidable reports whether the broker would answer "cannot determine" for a send numbered
// seq on this lane now: seq lies above what it has stored and at or below what it was sent,
// and an entry in flight will move the stored mark.
func (l *lane) undecidable(seq uint64) bool {
	return len(l.entries) > 0 && int64(seq) > l.persisted && int64(seq) <= l.lastPushed
}

// releaseWaiting writes the lane's held out-of-order sends that the broker can now judge, in
// the order they came; all of them when force is set (the lane reported an error).
func (p *Producer) releaseWaiting(l *lane, force bool, out *Output) {
	n := 0
	for ; n < len(l.waiting); n++ {
		h := &l.waiting[n]
		if !force && l.undecidable(h.send.SequenceID) {
			break
		}
		out.Broker = append(out.Broker, h.frame...)
		p.sentVerbatim(l, h.id, &h.send)
	}
	if n > 0 {
		l.waiting = append(l.waiting[:0], l.waiting[n:]...)
	}
}
