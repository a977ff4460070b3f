package rebatch

import (
	"bytes"
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

// heldFrame is a frame for a lane that must not reach the broker yet: an out-of-order send
// waiting until the broker can judge it (check), or any frame the engine made for the lane after
// one, which waits behind it so the broker gets the lane's frames in the order they were made
// (with de-duplication off the broker stores them all, and per-producer order must hold).
type heldFrame struct {
	e     inflight
	frame []byte
	check bool
}

// emitted is called right after a frame for lane l, in flight as e, was appended to
// out.Broker from offset start. It goes on as written, or, when the lane holds frames or check
// says the broker cannot judge it yet, it is taken back and held (releaseWaiting sends it).
func (p *Producer) emitted(l *lane, e inflight, check bool, out *Output, start int) {
	if len(l.waiting) == 0 && !check {
		l.push(e)
		return
	}
	if check {
		p.stats.SendsHeldForMark++
	}
	l.waiting = append(l.waiting, heldFrame{e: e, frame: bytes.Clone(out.Broker[start:]), check: check})
	p.heldBytes += len(out.Broker) - start
	out.Broker = out.Broker[:start]
}

// HeldBytes is how many bytes of frames the engine holds behind out-of-order sends; the proxy
// counts them in the producer's backlog (rebatching.go noteBacklog), so a client whose frames
// pile up there is slowed like one whose receipts are outstanding.
func (p *Producer) HeldBytes() int { return p.heldBytes }

// dropWaiting forgets the lane's held frames (their client resends them).
func (p *Producer) dropWaiting(l *lane) {
	for i := range l.waiting {
		p.heldBytes -= len(l.waiting[i].frame)
	}
	l.waiting = nil
}

// outOfOrder forwards an out-of-order send on the lane with the highest mark, at once when the
// broker can judge it, else once it can (releaseWaiting).
func (p *Producer) outOfOrder(now time.Time, f *wire.Frame, s *wire.Send, out *Output) error {
	if err := p.flushAll(out); err != nil {
		return err
	}
	l := p.highestLane()
	id := p.queueVerbatim(now, s)
	start := len(out.Broker)
	out.Broker = appendOnLane(out.Broker, f, s, l)
	p.sentVerbatim(l, id, s, l.undecidable(s.SequenceID), out, start)
	return nil
}

// undecidable reports whether the broker would answer "cannot determine" for a send numbered
// seq on this lane now: seq lies above what it has stored and at or below what it was sent,
// and an entry in flight will move the stored mark.
func (l *lane) undecidable(seq uint64) bool {
	return len(l.entries) > 0 && int64(seq) > l.persisted && int64(seq) <= l.lastPushed
}

// releaseWaiting writes the lane's held frames that may go now, in the order they were made:
// up to the first out-of-order send the broker cannot judge yet, or all of them when force is
// set (the lane reported an error, or the client's producer is being flushed before it
// closes). A dead engine's held frames are dropped: its client resends.
func (p *Producer) releaseWaiting(l *lane, force bool, out *Output) {
	if p.dead {
		p.dropWaiting(l)
		return
	}
	n := 0
	for ; n < len(l.waiting); n++ {
		h := &l.waiting[n]
		if h.check && !force && l.undecidable(h.e.lo) {
			break
		}
		out.Broker = append(out.Broker, h.frame...)
		p.heldBytes -= len(h.frame)
		l.push(h.e)
	}
	if n > 0 {
		l.waiting = append(l.waiting[:0], l.waiting[n:]...)
	}
}
