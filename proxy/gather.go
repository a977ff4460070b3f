package proxy

import "sync"

// Gathered writes. While a pump processes the frames one read delivered, the frames it forwards
// unchanged form a run of the read buffer (pumpBuf[pumpRun:pumpOff]), written with one Write when
// the pump ends or before anything else is written to the same side. The frames the proxy makes
// towards the pump's own destination (an engine's entries towards the broker while a client's
// SENDs are pumped, its receipts towards the client while the broker's are) would each cut the
// run and cost a write(2) of their own: with 64 synchronous producers on a connection, 64 system
// calls per read where passthrough makes one. Instead they are gathered, after the run so far,
// into one buffer that leaves in the pump's last Write, in the order the frames were made.
//
// Nothing else changes: frames towards the other side still flush the run (and the gathered
// bytes) first, a frame in transit still holds what follows it (contract 8), and when the pump
// fails the gathered bytes are written before the pair is closed, as they used to be, while
// the trailing run is dropped, as it was.
//
// The buffer is borrowed from a pool for the pump that needs one and returned when it is
// written, so idle sessions keep none (contract 7: memory is bounded by what is in flight).

// maxPooledGather is the largest gather buffer returned to the pool; a larger one (a burst of
// big entries) is left to the collector.
const maxPooledGather = 1 << 20

var gatherPool = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

// gatherOut appends b, a frame the proxy made towards the pump's destination, after the run
// forwarded so far. It reports false when b cannot be gathered (no pump, another side, a frame
// in transit): the caller writes it the usual way. Runs on the loop.
func (s *session) gatherOut(d direction, dst side, b []byte) bool {
	if s.pumpBuf == nil || d != s.pumpDir || dst != s.pumpDst || s.through[d] > 0 {
		return false
	}
	s.gatherRun()
	s.appendGather(b)
	return true
}

// gatherRun ends the run so far, before a frame the pump consumes (a SEND an engine takes) or
// one the proxy makes: the run joins the gathered bytes instead of being written at once, unless
// it can go nowhere (no destination yet, or a client that left), where it is flushed as before.
// Runs on the loop.
func (s *session) gatherRun() {
	if s.pumpDst == nil || (s.clientGone && s.pumpDir == toClient) {
		s.flushRun()
		return
	}
	s.appendGather(s.pumpBuf[s.pumpRun:s.pumpOff])
	s.pumpRun = s.pumpOff
}

// appendGather appends b to the gathered bytes, borrowing the buffer when b is the first.
func (s *session) appendGather(b []byte) {
	if len(b) == 0 {
		return
	}
	if s.gather == nil {
		s.gather = gatherPool.Get().(*[]byte)
	}
	*s.gather = append(*s.gather, b...)
}

// writeGathered writes the gathered bytes, followed by run (the pending run, or nil), with one
// Write, and returns the buffer to the pool. Runs on the loop.
func (s *session) writeGathered(run []byte) error {
	g := append(*s.gather, run...)
	var err error
	if !(s.clientGone && s.pumpDir == toClient) {
		_, err = s.pumpDst.Write(g)
	}
	if cap(g) <= maxPooledGather {
		*s.gather = g[:0]
		gatherPool.Put(s.gather)
	}
	s.gather = nil
	return err
}

// failPump fails the pair from inside a pump: the frames made before the failure are written
// first, as they were when each was written at once; the run not yet written is dropped, as it
// was. Runs on the loop.
func (s *session) failPump(err error) action {
	if s.gather != nil {
		_ = s.writeGathered(nil)
	}
	return s.fail(err)
}
