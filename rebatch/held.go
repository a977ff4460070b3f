package rebatch

import (
	"time"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// Sends the proxy answers itself. Duplicate-chunk removal (package chunkdedup) decides, for a
// resent chunk, to forward it, to answer it at once with the stored copy's position, or to
// answer it when the copy in flight is acknowledged. The engine keeps such sends in the
// client's queue like any other, so their receipts leave in the client's order.

// SendTagged forwards a client send f, whose CommandSend the caller parsed into s, unchanged,
// like a send that is never merged, and reports its fate to Config.OnTagged with tag (non-zero).
func (p *Producer) SendTagged(now time.Time, f wire.Frame, s *wire.Send, tag uint64, out *Output) error {
	if err := p.admit(s); err != nil {
		return err
	}
	p.stats.ClientSends++
	if err := p.verbatim(now, &f, s, out); err != nil {
		return err
	}
	l := p.lanes[0]
	l.entries[len(l.entries)-1].tag = tag
	return nil
}

// Hold queues a client send (its parsed CommandSend) that is not forwarded; Resolve, Fail or
// Promote settles it later. It returns the send's handle.
func (p *Producer) Hold(now time.Time, s *wire.Send, out *Output) (uint64, error) {
	if err := p.admit(s); err != nil {
		return 0, err
	}
	if err := p.flushAll(out); err != nil {
		return 0, err
	}
	p.stats.ClientSends++
	id := p.sendBase + uint64(p.Pending())
	p.sends = append(p.sends, clientSend{sentAt: now, seq: s.SequenceID, highest: s.HighestSequenceID, parts: 1})
	return id, nil
}

func (p *Producer) held(id uint64) *clientSend {
	if id < p.sendBase || id >= p.sendBase+uint64(p.Pending()) {
		return nil
	}
	return p.send(id)
}

// Resolve answers a held send with a receipt at ledger:entry, in its turn.
func (p *Producer) Resolve(id, ledger, entry uint64, out *Output) {
	if cs := p.held(id); cs != nil && cs.parts > 0 {
		cs.parts--
		cs.hasID, cs.ledger, cs.entry = true, ledger, entry
		p.release(out)
	}
}

// Fail answers a held send with a send error, in its turn.
func (p *Producer) Fail(id uint64, code pulsarpb.ServerError, message string, out *Output) {
	if cs := p.held(id); cs != nil && cs.parts > 0 {
		cs.parts--
		cs.failed, cs.errCode, cs.errMessage = true, code, message
		p.release(out)
	}
}

// Promote forwards a held send after all (its original failed): f is its frame, tag reports
// its fate as for SendTagged.
func (p *Producer) Promote(id uint64, f wire.Frame, tag uint64, out *Output) error {
	cs := p.held(id)
	if cs == nil {
		return ErrUnexpectedReceipt
	}
	s, err := wire.ParseSend(f)
	if err != nil {
		return err
	}
	if err := p.flushAll(out); err != nil {
		return err
	}
	l := p.lanes[0]
	hi := max(s.SequenceID, s.HighestSequenceID)
	start := len(out.Broker)
	out.Broker = append(out.Broker, f.Bytes()...)
	p.emitted(l, inflight{lo: s.SequenceID, hi: hi, one: sendRef{p, id, true}, tag: tag}, false, out, start)
	p.pushed(l, s.SequenceID, hi)
	p.stats.EntriesVerbatim++
	return nil
}
