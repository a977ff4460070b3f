package proxy

// Backpressure and the memory budget (doc.go contract 5). All of it runs on
// the session's loop unless said otherwise.

// budgetSoftLimit is the soft limit of every direction while the process
// holds more than half of Config.MemoryBudget (the other half is headroom
// for the garbage collector, per-connection state and gnet's buffer
// capacity; cmd/proxy sets Go's memory limit to the budget): a direction
// with more than this
// queued towards a slow side pauses (and parks its source) until the
// server is back under budget or its own queue drained.
const budgetSoftLimit = 256 << 10

// softLimit is the queue towards a side beyond which the proxy stops
// taking frames for it from the other side: the same for every session, and
// lowered while the server is over half its budget. Any goroutine may call it.
func (s *Server) softLimit() int {
	if b := s.cfg.MemoryBudget; b > 0 && s.held.Load() > int64(b/2) {
		return min(budgetSoftLimit, s.cfg.SoftBufferLimit)
	}
	return s.cfg.SoftBufferLimit
}

// publishHeld tells the server's budget how many bytes this session holds:
// unread input and queued output on both sides, frames held behind a cut
// through frame. Cheap enough for every OnTraffic (field reads, one atomic
// add when the figure changed).
func (s *session) publishHeld() {
	if s.state == stClosed {
		return // onClose took the session's bytes off the budget
	}
	n := int64(len(s.held[0]) + len(s.held[1]))
	n += int64(s.client.InboundBuffered() + s.client.OutboundBuffered())
	if s.broker != nil {
		n += int64(s.broker.InboundBuffered() + s.broker.OutboundBuffered())
	}
	if d := n - s.heldPub; d != 0 {
		s.srv.held.Add(d)
		s.heldPub = n
	}
}

// pause stops taking frames of direction d because the side they go to is
// slow, and parks the side they come from so that TCP slows the sender.
// If that side cannot be parked yet (bytes are queued for it), the pause
// holds its frames in gnet's inbound buffer (up to the hard limit) and the
// ticks retry the park.
func (s *session) pause(d direction) {
	s.setPaused(d, true)
	s.parkSource(d)
}

// parkSource parks the side frames of direction d are read from, unless
// the session cannot go without reading it.
func (s *session) parkSource(d direction) {
	src := s.source(d)
	if src == nil || s.state != stEstablished || s.clientGone {
		return
	}
	src.Park()
}

// unparkSource brings the source of direction d back to the loop (or, if
// it never left, wakes it for the frames it holds).
func (s *session) unparkSource(d direction) {
	if src := s.source(d); src != nil {
		src.Unpark()
	}
}

// noteOffLoop counts the session's sockets off the loop, for the ticker
// (which flushes their queued output and resumes them).
func (s *session) noteOffLoop(delta int32) {
	before := s.offLoop.Load()
	after := before + delta
	s.offLoop.Store(after)
	switch {
	case before == 0 && after > 0:
		s.srv.noffLoop.Add(1)
	case before > 0 && after == 0:
		s.srv.noffLoop.Add(-1)
	}
}

// tendParked runs from the ticker's resume task: it writes what waits for
// parked sockets and retries the park of paused directions whose source
// could not leave the loop yet. It reports an error that closes the pair.
func (s *session) tendParked() error {
	for _, k := range [2]side{s.client, s.broker} {
		if k == nil {
			continue
		}
		if err := k.FlushOut(); err != nil {
			return err
		}
	}
	for d := toBroker; d <= toClient; d++ {
		if s.paused[d] {
			s.parkSource(d)
		}
	}
	if s.backlogHeld {
		s.parkSource(toBroker)
	}
	return nil
}

// holdForBacklog stops taking the client's frames while its producer path
// waits for receipts (Backlogger), and parks the client so TCP slows it.
func (s *session) holdForBacklog() {
	s.backlogHeld = true
	s.parkSource(toBroker)
}
