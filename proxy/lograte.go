package proxy

import (
	"sync"
	"time"
)

// logEvery limits one repeated log event of one connection to a line per interval (DESIGN
// contract 7: one client never costs another its share of the log). The line that is let
// through says how many were suppressed since the previous one. It belongs to the goroutine of
// the connection that owns it (its event loop); it is not safe for concurrent use.
type logEvery struct {
	next       time.Time
	suppressed int
}

// logInterval is how often a connection may log one repeated event.
const logInterval = 10 * time.Second

// allow reports whether the event may be logged at now and, if so, how many occurrences were
// suppressed since the last line.
func (l *logEvery) allow(now time.Time) (ok bool, suppressed int) {
	if now.Before(l.next) {
		l.suppressed++
		return false, 0
	}
	l.next = now.Add(logInterval)
	suppressed, l.suppressed = l.suppressed, 0
	return true, suppressed
}

// sharedLogEvery is a logEvery any goroutine may use (events of no one
// connection, such as failed TLS handshakes).
type sharedLogEvery struct {
	mu sync.Mutex
	l  logEvery
}

func (s *sharedLogEvery) allow(now time.Time) (ok bool, suppressed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.l.allow(now)
}
