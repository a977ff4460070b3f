package proxy

// The connection core (session.go, backpressure.go, lookup.go and the
// producer paths) sees its two connections only through these types; the
// transports implement them: gnet (server.go, sock.go: plaintext, the hot
// path) and, in the core's specs, byte slices in memory (core_test.go).

// side is one of a session's two byte streams as the core sees it. Every
// method runs on the session's goroutine (its transport's loop).
type side interface {
	// InboundBuffered is the number of bytes read and not yet consumed.
	InboundBuffered() int
	// Peek returns the next n unconsumed bytes (n <= InboundBuffered),
	// valid until the next Discard or the return to the transport.
	Peek(n int) ([]byte, error)
	// Discard consumes n > 0 bytes.
	Discard(n int)
	// Write queues b towards the peer, in order with everything before.
	Write(b []byte) (int, error)
	// OutboundBuffered is the number of bytes written and not yet sent.
	OutboundBuffered() int
	// Close closes the stream; the session's onClose runs for it (at once
	// or from the transport's close callback).
	Close()
	// Wake makes the transport hand the stream's buffered input to the
	// session again (onTraffic).
	Wake()

	// Park stops reading the stream, so that TCP slows its sender
	// (doc.go contract 5). It reports false, changing nothing, when it
	// cannot now (not reading, or output is queued for the stream).
	Park() bool
	// Unpark reads a parked stream again; on a stream that is reading it
	// is Wake.
	Unpark()
	// Gone reports whether the stream is closed for good.
	Gone() bool
	// FlushOut retries output waiting for a parked stream (called from
	// ticks); an error closes the pair.
	FlushOut() error
}

// executor runs f on the session's goroutine. Any goroutine may call run; an
// error means f will not run (the transport is stopping).
type executor interface {
	run(f func()) error
}

// action is what the core asks of the transport after handling input.
type action uint8

const (
	keep      action = iota // go on
	closeSide               // close the side whose input was handled; onClose follows
)
