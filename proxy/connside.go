package proxy

import (
	"errors"
	"net"
	"sync"
	"time"
)

// The net.Conn transport: a session whose client arrived on a listener gnet
// cannot serve (TLS: crypto/tls wraps a net.Conn) runs on a goroutine of its
// own (connLoop), with both of its connections as connSides: a reader
// goroutine and a writer goroutine per connection, blocking I/O. Backpressure
// is the plain kind: a parked connSide's reader stops reading, so TCP slows
// the sender; a slow receiver's writer blocks and its queue grows until the
// session pauses the other direction, as on the gnet transport.

// connLoop is the executor of one session on the net.Conn transport: tasks
// run one at a time, in order, on its goroutine.
type connLoop struct {
	mu      sync.Mutex
	tasks   []func()
	spare   []func()
	wake    chan struct{}
	stopped bool
	// live counts the connSides not yet finished; the loop ends with the last.
	live int
}

func newConnLoop() *connLoop {
	l := &connLoop{wake: make(chan struct{}, 1)}
	go l.loop()
	return l
}

var errLoopStopped = errors.New("proxy: connection loop stopped")

// run implements executor. Any goroutine may call it.
func (l *connLoop) run(f func()) error {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return errLoopStopped
	}
	l.tasks = append(l.tasks, f)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return nil
}

func (l *connLoop) loop() {
	for range l.wake {
		l.mu.Lock()
		batch := l.tasks
		l.tasks = l.spare[:0]
		l.mu.Unlock()
		for i, f := range batch {
			f()
			batch[i] = nil
		}
		l.mu.Lock()
		l.spare = batch[:0]
		done := l.live == 0 && len(l.tasks) == 0
		if done {
			l.stopped = true
		}
		l.mu.Unlock()
		if done {
			return
		}
	}
}

// connReadChunk is what one read hands the session at most.
const connReadChunk = 64 << 10

// closeFlushTimeout bounds writing what is queued for a side being closed.
const closeFlushTimeout = 5 * time.Second

// connSide is one net.Conn of a session: both connections of a session on
// the net.Conn transport, or a TLS broker connection of any session. Its side
// methods run on the session's executor (a connLoop, or a gnet loop); its
// reader and writer goroutines touch only the fields under mu.
type connSide struct {
	l  executor
	e  *end
	c  net.Conn
	in []byte // loop-owned: read, not yet consumed
	// inBase is loop-owned: the whole array in lives in, reused once in is consumed.
	inBase []byte
	// gone is loop-owned: finish ran.
	gone bool

	mu       sync.Mutex
	cond     *sync.Cond
	parked   bool     // the reader waits before its next read
	out      outQueue // written by the session, not yet taken by the writer
	writing  int      // bytes the writer is writing now
	closing  bool     // the writer flushes, then closes c
	writeErr error
}

// newConnSide starts the reader and writer of c for end e on executor l.
func newConnSide(l executor, e *end, c net.Conn) *connSide {
	k := &connSide{l: l, e: e, c: c}
	k.cond = sync.NewCond(&k.mu)
	if cl, ok := l.(*connLoop); ok {
		cl.mu.Lock()
		cl.live++
		cl.mu.Unlock()
	}
	go k.reader()
	go k.writer()
	return k
}

// readAhead is how many read buffers a connSide's reader may hold: it reads
// into one while the session handles what it read into the other, so that
// reading (and TLS decryption) overlaps the session's work instead of
// waiting for it.
const readAhead = 2

func (k *connSide) reader() {
	// free holds the buffers the reader may read into. The session gives one
	// back for every buffer it is handed (input), so the reader waits only
	// while every buffer is with the session. The session's send never
	// blocks: free has room for more buffers than ever circulate.
	free := make(chan []byte, 2*readAhead)
	for range readAhead {
		free <- make([]byte, connReadChunk)
	}
	for {
		k.mu.Lock()
		for k.parked && !k.closing {
			k.cond.Wait()
		}
		k.mu.Unlock()
		buf := <-free
		n, err := k.c.Read(buf)
		if n > 0 {
			b := buf[:n]
			if k.l.run(func() {
				select {
				case free <- k.input(b):
				default: // more buffers than the reader needs: let this one go
				}
			}) != nil {
				return
			}
		} else {
			free <- buf
		}
		if err != nil {
			_ = k.l.run(func() { k.finish(err) })
			return
		}
	}
}

// input hands the session b, just read, and returns the buffer the reader reads into next. With
// nothing left unconsumed, b's array becomes the input as it is (no copy) and the reader gets the
// consumed one back; else b is appended. The session keeps no slice of its input past a call
// (as on gnet, whose buffer is reused), so a consumed array is free. Runs on the loop.
func (k *connSide) input(b []byte) []byte {
	if k.gone {
		return b
	}
	if len(k.in) > 0 {
		k.appendInput(b)
		k.handle()
		return b[:cap(b)]
	}
	spare := k.inBase
	k.in, k.inBase = b, b[:cap(b)]
	k.handle()
	if cap(spare) < connReadChunk {
		spare = make([]byte, connReadChunk)
	}
	return spare[:cap(spare)]
}

// appendInput appends b to the unconsumed input, moving it to the front of its array first
// when that makes room. Runs on the loop.
func (k *connSide) appendInput(b []byte) {
	if cap(k.in)-len(k.in) < len(b) && len(k.in)+len(b) <= cap(k.inBase) {
		k.in = k.inBase[:copy(k.inBase, k.in)]
	}
	c := cap(k.in)
	k.in = append(k.in, b...)
	if cap(k.in) != c {
		k.inBase = k.in[:cap(k.in)]
	}
}

// maxKeptInput is the largest input array kept for reuse once consumed; a burst's bigger one
// is let go.
const maxKeptInput = 1 << 20

// handle runs the session on the buffered input. Runs on the loop.
func (k *connSide) handle() {
	if k.gone || len(k.in) == 0 {
		return
	}
	if k.e.s.onTraffic(k.e) == closeSide {
		k.Close()
	}
}

func (k *connSide) writer() {
	var chunks [][]byte
	var scratch net.Buffers
	for {
		k.mu.Lock()
		for k.out.n == 0 && !k.closing {
			k.cond.Wait()
		}
		if k.out.n == 0 { // closing, everything written
			k.mu.Unlock()
			_ = k.c.Close() // the reader's Read fails: it reports the close to the loop
			return
		}
		k.writing = k.out.n
		chunks = k.out.take(chunks)
		closing := k.closing
		k.mu.Unlock()
		if closing {
			_ = k.c.SetWriteDeadline(time.Now().Add(closeFlushTimeout))
		}
		var err error
		_, scratch, err = writeChunks(k.c, chunks, scratch)
		releaseChunks(chunks)
		k.mu.Lock()
		k.writing = 0
		if err != nil {
			k.writeErr = err
			k.out.drop()
			k.closing = true
		}
		k.mu.Unlock()
		if err != nil {
			_ = k.c.Close()
			return
		}
	}
}

// InboundBuffered implements side.
func (k *connSide) InboundBuffered() int { return len(k.in) }

// Peek implements side.
func (k *connSide) Peek(n int) ([]byte, error) { return k.in[:n], nil }

// Discard implements side.
func (k *connSide) Discard(n int) {
	k.in = k.in[n:]
	if len(k.in) == 0 {
		if cap(k.inBase) > maxKeptInput {
			k.inBase = nil // let a burst's buffer go
		}
		k.in = k.inBase[:0]
	}
}

// Write implements side: b is queued for the writer goroutine.
func (k *connSide) Write(b []byte) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.writeErr != nil {
		return 0, k.writeErr
	}
	if k.closing {
		return 0, net.ErrClosed
	}
	k.out.append(b)
	k.cond.Broadcast()
	return len(b), nil
}

// OutboundBuffered implements side.
func (k *connSide) OutboundBuffered() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.out.n + k.writing
}

// Close implements side: what is queued is written (bounded by
// closeFlushTimeout), then the connection closes and finish runs.
func (k *connSide) Close() {
	k.mu.Lock()
	k.closing = true
	k.cond.Broadcast()
	k.mu.Unlock()
}

// finish reports the side closed for good to the session, once. Runs on the loop.
func (k *connSide) finish(err error) {
	if k.gone {
		return
	}
	k.gone = true
	k.Close()
	k.in = nil
	k.e.s.onClose(k.e, k, err)
	if cl, ok := k.l.(*connLoop); ok {
		cl.mu.Lock()
		cl.live--
		cl.mu.Unlock()
	}
}

// Wake implements side.
func (k *connSide) Wake() { _ = k.l.run(k.handle) }

// Park implements side: the reader stops after the read it may be in.
func (k *connSide) Park() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.parked || k.closing {
		return false
	}
	k.parked = true
	k.e.s.srv.m.parks[k.e.dir].Add(1)
	return true
}

// Unpark implements side.
func (k *connSide) Unpark() {
	k.mu.Lock()
	k.parked = false
	k.cond.Broadcast()
	k.mu.Unlock()
	k.Wake()
}

// Gone implements side.
func (k *connSide) Gone() bool { return k.gone }

// FlushOut implements side; the writer goroutine writes on its own.
func (k *connSide) FlushOut() error { return nil }
