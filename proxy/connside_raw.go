package proxy

import (
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// rawConn is the TCP connection under a connSide, below its TLS if it has
// any. Until the side starts it is the plain connection (the TLS handshake
// blocks on its own goroutine). Once the side runs, a Write never blocks: it
// writes to the socket at once when nothing is waiting before it, with one
// non-blocking write(2), and spills what the socket does not take, in
// order, for the side's writer goroutine, which writes it blocking.
//
// That is why a connSide encrypts and writes on the session's goroutine:
// a frame the proxy forwards leaves in the time slice that read it, with no
// hand-off to a writer goroutine unless the receiver is slow (for a
// synchronous send over TLS, two goroutine wake-ups fewer per message). The
// spill is the side's outbound queue: its size is what OutboundBuffered
// reports, so backpressure (contract 5) sees a slow receiver as before.
//
// Under TLS it also buffers reads (readBuffered): one read(2) takes every
// record the socket holds, where crypto/tls would read about one at a time,
// and the side's reader can then take the records already received without
// a chance of blocking (noWait), to hand the session many frames at once.
//
// Write may be called from any goroutine (crypto/tls writes alerts from the
// reader's); the fields below mu are shared with the writer goroutine. The
// read fields belong to whoever reads: the handshake's goroutine, then the
// side's reader.
type rawConn struct {
	net.Conn
	rc syscall.RawConn // nil when Conn gives no descriptor: every write spills

	readBuffered bool   // set before the reader starts
	noWait       bool   // a Read finding rbuf empty fails at once (os.ErrDeadlineExceeded)
	rbuf         []byte // read from the socket, not yet taken (from roff on)
	roff         int

	mu      sync.Mutex
	cond    *sync.Cond
	async   bool     // the side runs: writes never block
	spill   outQueue // bytes the socket did not take yet, in order
	writing int      // bytes of the spill the writer is writing now
	closing bool     // the writer writes the spill, then closes the connection
	err     error    // the first write error; every later write fails with it
	// held: a connSide write is being sealed into TLS records, which
	// gather in hold and leave together at release (one write(2) where
	// crypto/tls makes one per 16 KiB record).
	held bool
	hold []byte
}

// maxKeptHold is the largest hold buffer kept between writes.
const maxKeptHold = 256 << 10

// newRawConn wraps c (a connection just accepted or dialled).
func newRawConn(c net.Conn) *rawConn {
	r := &rawConn{Conn: c}
	r.cond = sync.NewCond(&r.mu)
	if sc, ok := c.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			r.rc = rc
		}
	}
	return r
}

// rawOf returns the rawConn under c, wrapping c if it has none.
func rawOf(c net.Conn) (net.Conn, *rawConn) {
	if nc, ok := c.(interface{ NetConn() net.Conn }); ok { // *tls.Conn
		if r, ok := nc.NetConn().(*rawConn); ok {
			return c, r
		}
	}
	if r, ok := c.(*rawConn); ok {
		return c, r
	}
	r := newRawConn(c)
	return r, r
}

// Read implements net.Conn: see the type's doc.
func (r *rawConn) Read(p []byte) (int, error) {
	if r.roff < len(r.rbuf) {
		n := copy(p, r.rbuf[r.roff:])
		r.roff += n
		return n, nil
	}
	if r.noWait {
		// A timeout, which crypto/tls takes as temporary: the record it
		// has begun stays buffered for the next Read.
		return 0, os.ErrDeadlineExceeded
	}
	if !r.readBuffered {
		return r.Conn.Read(p)
	}
	if r.rbuf == nil {
		r.rbuf = make([]byte, connReadChunk)
	}
	n, err := r.Conn.Read(r.rbuf[:cap(r.rbuf)])
	r.rbuf = r.rbuf[:max(n, 0)]
	r.roff = copy(p, r.rbuf)
	return r.roff, err
}

// start makes writes non-blocking; called once, before the side's first write.
func (r *rawConn) start() {
	r.mu.Lock()
	r.async = true
	r.mu.Unlock()
}

// Write implements net.Conn: see the type's doc.
func (r *rawConn) Write(b []byte) (int, error) {
	r.mu.Lock()
	if !r.async {
		r.mu.Unlock()
		return r.Conn.Write(b)
	}
	defer r.mu.Unlock()
	if r.err != nil {
		return 0, r.err
	}
	n := len(b)
	if r.held {
		r.hold = append(r.hold, b...)
		return n, nil
	}
	if r.spill.n == 0 && r.writing == 0 {
		b = b[r.tryWrite(b):]
		if r.err != nil {
			return 0, r.err
		}
	}
	if len(b) > 0 {
		r.spill.append(b)
		r.cond.Broadcast()
	}
	return n, nil
}

// gather starts holding writes; release writes what was held.
func (r *rawConn) gather() {
	r.mu.Lock()
	r.held = true
	r.mu.Unlock()
}

// release ends gather: the held bytes go out as one Write would.
func (r *rawConn) release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.held = false
	b := r.hold
	if r.err == nil && len(b) > 0 {
		if r.spill.n == 0 && r.writing == 0 {
			b = b[r.tryWrite(b):]
		}
		if r.err == nil && len(b) > 0 {
			r.spill.append(b)
			r.cond.Broadcast()
		}
	}
	if cap(r.hold) > maxKeptHold {
		r.hold = nil
	} else {
		r.hold = r.hold[:0]
	}
}

// tryWrite writes what the socket takes at once and returns how much; a
// failure other than a full socket sets err and asks the writer to close.
// Holds mu.
func (r *rawConn) tryWrite(b []byte) int {
	if r.rc == nil {
		return 0
	}
	var n int
	var werr error
	err := r.rc.Write(func(fd uintptr) bool {
		for {
			n, werr = unix.Write(int(fd), b)
			if werr != unix.EINTR {
				return true // never wait: what is left spills
			}
		}
	})
	switch {
	case err != nil:
		werr = err
	case werr == unix.EAGAIN:
		return 0
	}
	if werr != nil {
		r.err = werr
		r.closing = true
		r.spill.drop()
		r.cond.Broadcast()
		return 0
	}
	return max(n, 0)
}

// buffered is the bytes written and not yet taken by the socket.
func (r *rawConn) buffered() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.spill.n + r.writing
}

// closeAfterSpill asks the writer to write the spill (bounded by
// closeFlushTimeout), then close the connection.
func (r *rawConn) closeAfterSpill() {
	r.mu.Lock()
	r.closing = true
	r.cond.Broadcast()
	r.mu.Unlock()
}

// writeSpill is the side's writer goroutine: it writes the spill, blocking,
// until the side closes; then it closes closer (the side's connection, TLS
// included, so its close is orderly).
func (r *rawConn) writeSpill(closer net.Conn) {
	var chunks [][]byte
	var scratch net.Buffers
	for {
		r.mu.Lock()
		for r.spill.n == 0 && !r.closing {
			r.cond.Wait()
		}
		if r.spill.n == 0 { // closing, everything written
			r.mu.Unlock()
			_ = closer.Close() // the reader's Read fails: it reports the close to the loop
			return
		}
		r.writing = r.spill.n
		chunks = r.spill.take(chunks)
		closing := r.closing
		r.mu.Unlock()
		if closing {
			_ = r.Conn.SetWriteDeadline(time.Now().Add(closeFlushTimeout))
		}
		var err error
		_, scratch, err = writeChunks(r.Conn, chunks, scratch)
		releaseChunks(chunks)
		r.mu.Lock()
		r.writing = 0
		if err != nil && r.err == nil {
			r.err = err
		}
		if err != nil {
			r.spill.drop()
			r.closing = true
		}
		r.mu.Unlock()
		if err != nil {
			_ = r.Conn.Close()
			return
		}
	}
}
