package proxy

import (
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"

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
// On sparse traffic the socket is read and written with raw system calls, which do not enter
// the Go scheduler: an ordinary one wakes the runtime's monitor thread (sysmon) whenever the
// whole process was idle, and for request-response traffic (a synchronous send over TLS) that
// wake-up and sysmon's polling until the process idled again were half of the proxy's CPU
// (e2e/proxy/bench, sessions 17-18 and 24). Sparse means: reads, those that find nothing too,
// are raw while each of the last sparseAfter reads that returned input took at most sparseMax
// bytes, quickGap or more after the one before; writes likewise. A stream the proxy fell behind
// on is not sparse: after a pause its read finds much. (A raw call holds its P for its copy,
// which sparseMax keeps short.) Within a stream the calls stay ordinary: made raw there
// too (session 18), reads returned sooner with less, and the broker received more, smaller TLS
// records and spent more CPU per message.
//
// An idle connection holds no buffer here: the read buffer is borrowed from
// a pool when the socket is readable and returned once TLS has taken it,
// and the gathering buffer is borrowed for one write (contract 7). Only the
// spill grows, and backpressure bounds it.
//
// Write may be called from any goroutine (crypto/tls writes alerts from the
// reader's); the fields below mu are shared with the writer goroutine. The
// read fields belong to whoever reads: the handshake's goroutine, then the
// side's reader.
type rawConn struct {
	net.Conn
	rc syscall.RawConn // nil when Conn gives no descriptor: every write spills

	readBuffered bool   // TLS above: set before the reader starts
	lastRead     int64  // monotonicNow of the last read that returned input; the reader's
	readGaps     uint8  // reads with input in a row that came quickGap or more after the one before; the reader's
	noWait       bool   // a Read finding rbuf empty fails at once (os.ErrDeadlineExceeded)
	rbuf         []byte // read from the socket, not yet taken (from roff on), at the start of a pooled array; nil when empty
	roff         int
	streaming    bool        // the last read would have filled a small array (connside_chunks.go); the reader's
	arrays       *readArrays // lends the read arrays (connside_chunks.go)
	rerr         error       // the read error met by fill; Read returns it once rbuf is taken

	mu      sync.Mutex
	cond    *sync.Cond
	async   bool     // the side runs: writes never block
	spill   outQueue // bytes the socket did not take yet, in order
	writing int      // bytes of the spill the writer is writing now
	closing bool     // the writer writes the spill, then closes the connection
	err     error    // the first write error; every later write fails with it
	// held: a connSide write (at most sealPiece bytes) is being sealed into
	// TLS records, which gather in hold (a pooled chunk, borrowed for the
	// write) and leave together at release: one write(2) where crypto/tls
	// makes one per record of at most 16 KiB.
	held      bool
	hold      []byte
	lastWrite int64 // monotonicNow of the last direct write (tryWrite; the writer's spill writes are not counted)
	writeGaps uint8 // writes in a row that came quickGap or more after the one before
	// closed runs on the writer goroutine once it has closed the
	// connection, so that a parked reader stops waiting for a dead socket.
	closed func()
}

// Traffic is sparse once sparseAfter reads (or writes) in a row each moved at most sparseMax
// bytes, quickGap or more after the one before (see rawConn).
const (
	quickGap    = 500 * time.Microsecond
	sparseAfter = 2
	sparseMax   = 2 << 10
)

// nextGaps counts one more read or write of n bytes, gap after the one before, into a run of
// sparse ones (capped at sparseAfter).
func nextGaps(run uint8, gap int64, n int) uint8 {
	if gap < int64(quickGap) || n > sparseMax {
		return 0
	}
	return min(run+1, sparseAfter)
}

// monotonicNow is a monotonic clock in nanoseconds, for quickGap. Any goroutine may call it.
func monotonicNow() int64 { return int64(time.Since(clockBase)) }

var clockBase = time.Now()

// sealPiece is the most a connSide hands crypto/tls in one gathered write:
// its records, with their headers, nonces and tags, fit one outQueue chunk.
const sealPiece = outChunkSize - 4<<10

// newRawConn wraps c (a connection just accepted or dialled).
func newRawConn(c net.Conn) *rawConn {
	r := &rawConn{Conn: c, arrays: unboundedArrays}
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

// Read implements net.Conn: see the type's doc. It runs on the reader.
func (r *rawConn) Read(p []byte) (int, error) {
	if !r.readBuffered { // the handshake, or a side without TLS
		return r.Conn.Read(p)
	}
	if r.rbuf == nil && r.rerr == nil && !r.noWait {
		r.fill()
	}
	switch {
	case r.rbuf != nil:
		return r.take(p), nil
	case r.rerr != nil:
		return 0, r.rerr
	}
	// A timeout, which crypto/tls takes as temporary: the record it has
	// begun stays buffered for the next Read.
	return 0, os.ErrDeadlineExceeded
}

// fill waits until the socket has input and reads it into rbuf; a read
// error (io.EOF too) is kept in rerr, for Read to return once rbuf is
// taken. Runs on the reader.
func (r *rawConn) fill() {
	if r.rbuf != nil || r.rerr != nil {
		return
	}
	b, err := r.readChunk()
	if err != nil {
		r.rerr = err
		return
	}
	r.rbuf, r.roff = b, 0
}

// readChunk waits until the socket has input, or its end or an error, and
// reads it into a pooled array (connside_chunks.go), borrowed only once there
// is something to read: a connection waiting for input holds no buffer. It
// returns the bytes read (at least one) at the start of the array, or an
// error (io.EOF at the end) and nothing. Runs on the reader.
func (r *rawConn) readChunk() ([]byte, error) {
	var a []byte
	var n int
	var err error
	if r.rc == nil { // no descriptor to wait on: a blocking read, holding the array
		a = r.arrays.get(r.streaming)
		if n, err = r.Conn.Read(a); n == 0 {
			r.arrays.put(a)
			if err == nil {
				err = io.ErrNoProgress
			}
			return nil, err
		}
		r.streaming = streamingAfter(n)
		return a[:n], nil // an error with n > 0 comes back with the next read
	}
	var rerr error
	err = r.rc.Read(func(fd uintptr) bool {
		a = r.arrays.get(r.streaming) // decided now: the wait before may have been long
		for {
			if r.readGaps >= sparseAfter { // every read until input comes closer, those finding none too
				// At most sparseMax+1 bytes: more ends the run, and the copy a raw call makes
				// holding its P stays short.
				n, rerr = rawRead(int(fd), a[:sparseMax+1])
			} else {
				n, rerr = unix.Read(int(fd), a)
			}
			if rerr != unix.EINTR {
				break
			}
		}
		if rerr == unix.EAGAIN {
			r.arrays.put(a)
			return false // wait for input, holding no buffer
		}
		if n <= 0 {
			r.arrays.put(a)
		}
		return true
	})
	if n > 0 {
		now := monotonicNow()
		r.readGaps, r.lastRead = nextGaps(r.readGaps, now-r.lastRead, n), now
		r.streaming = streamingAfter(n)
	}
	switch {
	case err != nil:
		return nil, err
	case rerr != nil:
		return nil, &net.OpError{Op: "read", Net: "tcp", Source: r.LocalAddr(), Addr: r.RemoteAddr(), Err: os.NewSyscallError("read", rerr)}
	case n == 0:
		return nil, io.EOF
	}
	return a[:n], nil
}

// take copies what rbuf holds to p, returning the array once it is all taken.
func (r *rawConn) take(p []byte) int {
	n := copy(p, r.rbuf[r.roff:])
	r.roff += n
	if r.roff == len(r.rbuf) {
		r.arrays.put(r.rbuf)
		r.rbuf, r.roff = nil, 0
	}
	return n
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
	if r.err != nil {
		r.mu.Unlock()
		return 0, r.err
	}
	if !r.async { // the handshake, or the writer's close (the session writes no more)
		r.mu.Unlock()
		return r.Conn.Write(b)
	}
	defer r.mu.Unlock()
	if r.held {
		r.hold = append(r.hold, b...)
		return len(b), nil
	}
	if r.send(b); r.err != nil {
		return 0, r.err
	}
	return len(b), nil
}

// send writes b to the socket if nothing waits before it, and spills what
// the socket does not take; a failure sets err. Holds mu.
func (r *rawConn) send(b []byte) {
	if r.spill.n == 0 && r.writing == 0 {
		b = b[r.tryWrite(b):]
	}
	if r.err == nil && len(b) > 0 {
		r.spill.append(b)
		r.cond.Broadcast()
	}
}

// gather starts holding writes; release writes what was held.
func (r *rawConn) gather() {
	r.mu.Lock()
	r.held = true
	r.hold = outChunkPool.Get().(*[outChunkSize]byte)[:0]
	r.mu.Unlock()
}

// release ends gather: the held bytes go out as one Write would.
func (r *rawConn) release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.held = false
	if r.err == nil && len(r.hold) > 0 {
		r.send(r.hold)
	}
	if cap(r.hold) == outChunkSize { // unless sealing outgrew it
		outChunkPool.Put((*[outChunkSize]byte)(r.hold[:outChunkSize]))
	}
	r.hold = nil
}

// tryWrite writes what the socket takes at once and returns how much; a
// failure other than a full socket sets err and asks the writer to close.
// Called with nothing spilled or being written. Holds mu.
func (r *rawConn) tryWrite(b []byte) int {
	if r.rc == nil {
		return 0
	}
	var n int
	var werr error
	now := monotonicNow()
	r.writeGaps, r.lastWrite = nextGaps(r.writeGaps, now-r.lastWrite, len(b)), now
	quick := r.writeGaps >= sparseAfter
	err := r.rc.Write(func(fd uintptr) bool {
		for {
			if quick {
				n, werr = rawWrite(int(fd), b)
			} else {
				n, werr = unix.Write(int(fd), b)
			}
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

// closeAfterSpill asks the writer to write the spill, then close the
// connection. The deadline bounds a write already blocked on a receiver that
// stopped reading, too.
func (r *rawConn) closeAfterSpill() {
	r.mu.Lock()
	first := !r.closing
	r.closing = true
	r.cond.Broadcast()
	r.mu.Unlock()
	if first {
		_ = r.Conn.SetWriteDeadline(time.Now().Add(closeFlushTimeout))
	}
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
			// Writes block again, so the close_notify crypto/tls sends
			// goes out (under its own deadline) instead of spilling.
			r.async = false
			r.mu.Unlock()
			_ = closer.Close() // the reader's Read fails: it reports the close to the loop
			r.closed()
			return
		}
		r.writing = r.spill.n
		chunks = r.spill.take(chunks)
		r.mu.Unlock()
		var err error
		_, scratch, err = writeChunks(r.Conn, chunks, scratch)
		releaseChunks(chunks)
		r.mu.Lock()
		r.writing = 0
		if err == nil {
			r.mu.Unlock()
			continue
		}
		if r.err == nil {
			r.err = err
		}
		r.spill.drop()
		r.closing = true
		r.mu.Unlock()
		_ = r.Conn.Close()
		r.closed()
		return
	}
}

// rawRead is unix.Read without entering the scheduler (see rawConn), for a non-blocking socket.
func rawRead(fd int, p []byte) (int, error) {
	n, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if e != 0 {
		return -1, e
	}
	return int(n), nil
}

// rawWrite is unix.Write without entering the scheduler (see rawConn), for a non-blocking socket.
func rawWrite(fd int, p []byte) (int, error) {
	n, _, e := unix.RawSyscall(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if e != 0 {
		return -1, e
	}
	return int(n), nil
}
