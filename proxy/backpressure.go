package proxy

// Backpressure and the memory budget (doc.go contract 5). All of it runs on
// the session's loop unless said otherwise.

import "time"

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
// resume checks retry the park.
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

// noteOffLoop counts the session's sockets off the loop, for the resume
// checks (which flush their queued output and bring them back).
func (s *session) noteOffLoop(delta int32) {
	before := s.offLoop.Load()
	after := before + delta
	s.offLoop.Store(after)
	if delta > 0 {
		s.startResumeChecks()
	}
}

// needsResume says the session has a paused direction or a socket off the
// loop: something only a resume check (resumeAsync) ends. Any goroutine may
// call it.
func (s *session) needsResume() bool { return s.pausedAny.Load() || s.offLoop.Load() > 0 }

// startResumeChecks (re)starts the resume checks of a session that has
// just paused a direction, parked a socket or left output waiting for a
// full parked socket (sock.Write): the first within pausedTick, whatever
// the ticker's pace, and whatever pace the checks had slowed to if the
// session already needed them for something else. A pause that began while
// the ticker slept its tickInterval used to wait up to that long for its
// first check, while the queue that caused it drained in a few
// milliseconds and its receiver then sat idle: 10 KB batched sends ran at
// 0.73x direct through the proxy with the machine 30 % idle, and every
// resume found the queue empty (e2e/proxy/bench, session 27). Runs on the
// loop.
func (s *session) startResumeChecks() {
	s.needSince = s.srv.clock().UnixNano()
	s.armResume(pausedTick)
}

// nextResumeCheck arms the check after one that found the session still
// in need: a quarter of the time since the last pause, park or output left
// waiting for a full parked socket, between pausedTick and tickInterval. A
// receiver draining the queue at any steady rate is thus checked before it
// has drained 5/8 of the queue the pause began with (the threshold is half
// of it, and the next check comes at most a quarter later than the
// threshold's time), so it does not starve; a side slow for long (a
// consumer that stopped reading) costs ten checks a second, not five
// hundred. Runs on the loop.
func (s *session) nextResumeCheck() {
	s.armResume(resumeCheckWait(time.Duration(s.srv.clock().UnixNano() - s.needSince)))
}

// resumeCheckWait is the wait before the next resume check of a session in
// need for inNeed (nextResumeCheck).
func resumeCheckWait(inNeed time.Duration) time.Duration {
	return min(max(inNeed/4, pausedTick), tickInterval)
}

// armResume has resumeAsync run after wait. Runs on the loop.
func (s *session) armResume(wait time.Duration) {
	if s.resumeTimer == nil {
		s.resumeTimer = time.AfterFunc(wait, s.resumeAsync)
		return
	}
	s.resumeTimer.Reset(wait)
}

// tendParked runs from the resume task: it writes what waits for
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
