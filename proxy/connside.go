package proxy

import (
	"errors"
	"net"
	"os"
	"sync"
	"time"
)

// The net.Conn transport: a session whose client arrived on a listener gnet
// cannot serve (TLS: crypto/tls wraps a net.Conn) runs on a goroutine of its
// own (connLoop), with both of its connections as connSides: a reader
// goroutine per connection, blocking reads, which runs the session on what
// it read when the loop is free; writes from the session go to the socket at
// once, without blocking (connside_raw.go), and a writer goroutine per
// connection writes, blocking, only what a slow receiver did not take.
// Backpressure is the plain kind: a parked connSide's reader stops reading,
// so TCP slows the sender; a slow receiver's untaken bytes grow until the
// session pauses the other direction, as on the gnet transport.

// connLoop is the executor of one session on the net.Conn transport: tasks
// run one at a time, in order. Whoever runs them owns the loop: its own
// goroutine, or a connSide's reader handing over what it just read
// (runHere), which saves a goroutine switch per read. running says the loop
// is owned; tasks queued while it is are taken by the owner before it lets
// go, and an inline owner that finds more queued after its own task passes
// them to the loop's goroutine rather than stay away from its reading.
type connLoop struct {
	mu      sync.Mutex
	tasks   []func()
	spare   []func()
	running bool
	// wake passes ownership to the loop's goroutine; at most one send is
	// outstanding, since only the owner sends and the goroutine then owns.
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

// run implements executor: f is queued for the loop's goroutine (or the
// owner of the moment). Any goroutine may call it, holding any lock: f never
// runs on the caller's goroutine.
func (l *connLoop) run(f func()) error {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return errLoopStopped
	}
	l.tasks = append(l.tasks, f)
	if l.running {
		l.mu.Unlock()
		return nil
	}
	l.running = true
	l.mu.Unlock()
	l.wake <- struct{}{}
	return nil
}

// runHere runs f on the caller's goroutine when the loop is free, else
// queues it as run does. Only a connSide's reader calls it: a goroutine that
// holds no lock and that the session never waits for.
func (l *connLoop) runHere(f func()) error {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return errLoopStopped
	}
	if l.running {
		l.tasks = append(l.tasks, f)
		l.mu.Unlock()
		return nil
	}
	l.running = true // nothing is queued while the loop is free
	l.mu.Unlock()
	f()
	l.mu.Lock()
	if len(l.tasks) > 0 {
		l.mu.Unlock()
		l.wake <- struct{}{}
		return nil
	}
	l.releaseLocked()
	l.mu.Unlock()
	return nil
}

// releaseLocked lets the loop go with nothing queued; the loop stops for
// good once no connSide is left. Called by the owner, holding mu.
func (l *connLoop) releaseLocked() {
	l.running = false
	if l.live == 0 && !l.stopped {
		l.stopped = true
		close(l.wake)
	}
}

func (l *connLoop) loop() {
	for range l.wake {
		for {
			l.mu.Lock()
			batch := l.tasks
			if len(batch) == 0 {
				l.releaseLocked()
				l.mu.Unlock()
				break
			}
			l.tasks = l.spare[:0]
			l.mu.Unlock()
			for i, f := range batch {
				f()
				batch[i] = nil
			}
			l.mu.Lock()
			l.spare = batch[:0]
			l.mu.Unlock()
		}
	}
}

// runOnLoop is how a reader hands its input to executor x: inline on a free
// connLoop, queued on a gnet loop (whose goroutine only gnet may borrow).
func runOnLoop(x executor, f func()) error {
	if l, ok := x.(*connLoop); ok {
		return l.runHere(f)
	}
	return x.run(f)
}

// closeFlushTimeout bounds writing what is queued for a side being closed
// (a variable only so that specs can wait less).
var closeFlushTimeout = 5 * time.Second

// connSide is one net.Conn of a session: both connections of a session on
// the net.Conn transport, or a TLS broker connection of any session. Its side
// methods run on the session's executor (a connLoop, or a gnet loop), which
// its reader goroutine may be while it runs its input (runHere); otherwise
// the reader touches only the fields under mu and raw's read side, and raw's
// writer goroutine only raw's fields under raw.mu.
type connSide struct {
	l  executor
	e  *end
	c  net.Conn
	in []byte // loop-owned: read, not yet consumed
	// inBase is loop-owned: the whole array in lives in, let go once in is consumed.
	inBase []byte
	// tlsMore is the reader's: its last read over TLS filled its buffer, so
	// crypto/tls or raw may hold records already received.
	tlsMore bool
	// streaming is the reader's: its last read over TLS would have filled a
	// small array, so the next takes a large one (connside_chunks.go).
	streaming bool
	// gone is loop-owned: finish ran.
	gone bool

	// raw is the TCP connection under c (c itself without TLS): the
	// outbound side, written on the session's goroutine, spilling to the
	// writer goroutine what the socket does not take (connside_raw.go).
	raw *rawConn

	mu      sync.Mutex
	cond    *sync.Cond
	parked  bool // the reader waits before its next read
	closing bool // Close ran: writes are refused, the reader stops waiting
}

// newConnSide starts the reader and writer of c for end e on executor l.
func newConnSide(l executor, e *end, c net.Conn) *connSide {
	k := &connSide{l: l, e: e}
	k.c, k.raw = rawOf(c)
	k.raw.readBuffered = k.c != net.Conn(k.raw) // TLS above it
	// The handshake may have read records past its own: take them first.
	k.tlsMore = k.raw.readBuffered
	k.raw.closed = k.socketClosed
	k.raw.arrays = e.s.srv.readArrays
	k.raw.start()
	k.cond = sync.NewCond(&k.mu)
	if cl, ok := l.(*connLoop); ok {
		cl.mu.Lock()
		cl.live++
		cl.mu.Unlock()
	}
	go k.reader()
	go k.raw.writeSpill(k.c)
	return k
}

// readAhead is how many reads a connSide's reader may have handed the
// session and not yet seen run: when the session's executor is busy (running
// the other side's input, or a gnet loop's other connections) the reader's
// input waits in the queue and the reader reads on, so reading (and TLS
// decryption) overlaps the session's work instead of waiting for it.
const readAhead = 2

// The reader's buffers. Each read goes into a pooled array (connside_chunks.go),
// borrowed once the socket is readable (rawConn.readChunk); the session
// takes it as its input as it is, with nothing left unconsumed before it,
// or appends it to what is, and returns every array it no longer needs to
// the pool when its call ends. An idle side, a parked one too, thus holds
// no buffer: only a frame begun and not yet complete stays (the inbound
// bytes that backpressure counts), and crypto/tls's own record buffers.

func (k *connSide) reader() {
	// turns counts the reads the reader may hand the session before it sees
	// one run. The session gives a turn back for every read it runs; its
	// send never blocks (the channel has room for every turn).
	turns := make(chan struct{}, readAhead)
	for range readAhead {
		turns <- struct{}{}
	}
	for {
		k.mu.Lock()
		for k.parked && !k.closing {
			k.cond.Wait()
		}
		k.mu.Unlock()
		<-turns
		b, err := k.read()
		if len(b) > 0 {
			if runOnLoop(k.l, func() {
				k.input(b)
				select {
				case turns <- struct{}{}:
				default:
				}
			}) != nil {
				k.raw.arrays.put(b)
				return
			}
		} else {
			turns <- struct{}{}
		}
		if err != nil {
			_ = runOnLoop(k.l, func() { k.finish(err) })
			return
		}
	}
}

// read waits for input and returns it at the start of a pooled array (some
// bytes), or nothing. Over TLS it first waits for the socket (holding no buffer)
// and then takes every record already received: crypto/tls returns one
// record per Read, and a session handed each on its own writes each frame
// of a stream of small ones with a TLS record and a write(2) of its own.
// Runs on the reader.
func (k *connSide) read() ([]byte, error) {
	if !k.raw.readBuffered {
		return k.raw.readChunk()
	}
	if !k.tlsMore {
		k.raw.fill()
	}
	buf := k.raw.arrays.get(k.streaming || k.raw.streaming)
	n := 0
	var err error
	k.raw.noWait = true
	for n < len(buf) {
		var m int
		m, err = k.c.Read(buf[n:])
		n += m
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				err = nil // nothing more received yet
			}
			break
		}
		if m == 0 {
			break
		}
	}
	k.raw.noWait = false
	// A full buffer may leave records, or a record's rest, in crypto/tls
	// or in raw: the next read takes them before it waits.
	k.tlsMore = n == len(buf)
	k.streaming = streamingAfter(n)
	if n == 0 {
		k.raw.arrays.put(buf)
		return nil, err
	}
	return buf[:n], err
}

// input hands the session b, just read (at the start of an array of k.raw.arrays).
// With nothing left unconsumed, b's array becomes the input as it is (no
// copy); else b is appended and its array goes back to the pool. The
// session keeps no slice of its input past a call (as on gnet, whose buffer
// is reused), so the array is free once handle has consumed it. Runs on the
// loop.
func (k *connSide) input(b []byte) {
	if k.gone {
		k.raw.arrays.put(b)
		return
	}
	if len(k.in) > 0 {
		k.appendInput(b)
		k.raw.arrays.put(b)
	} else {
		k.in, k.inBase = b, b[:cap(b)]
	}
	k.handle()
}

// appendInput appends b to the unconsumed input, moving it to the front of its array first
// when that makes room; an array the input outgrew goes back to the lender. Runs on the loop.
func (k *connSide) appendInput(b []byte) {
	if cap(k.in)-len(k.in) < len(b) && len(k.in)+len(b) <= cap(k.inBase) {
		k.in = k.inBase[:copy(k.inBase, k.in)]
	}
	c, old := cap(k.in), k.inBase
	k.in = append(k.in, b...)
	if cap(k.in) != c {
		k.inBase = k.in[:cap(k.in)]
		k.raw.arrays.put(old)
	}
}

// handle runs the session on the buffered input, then lets the input's
// array go if the session consumed all of it. Runs on the loop.
func (k *connSide) handle() {
	if k.gone || len(k.in) == 0 {
		return
	}
	if k.e.s.onTraffic(k.e) == closeSide {
		k.Close()
	}
	switch {
	case len(k.in) == 0 && k.inBase != nil:
		k.raw.arrays.put(k.inBase)
		k.in, k.inBase = nil, nil
	case cap(k.inBase) == streamReadChunk && len(k.in) <= connReadChunk:
		// A remainder (a frame begun) that a small array holds: the large one goes back,
		// rather than wait, perhaps parked, for the rest (connside_chunks.go).
		small := k.raw.arrays.get(false)
		n := copy(small, k.in)
		k.raw.arrays.put(k.inBase)
		k.in, k.inBase = small[:n], small
	}
}

// InboundBuffered implements side.
func (k *connSide) InboundBuffered() int { return len(k.in) }

// Peek implements side.
func (k *connSide) Peek(n int) ([]byte, error) { return k.in[:n], nil }

// Discard implements side. The input's array stays until handle returns:
// the session may still be writing the frames it just discarded.
func (k *connSide) Discard(n int) { k.in = k.in[n:] }

// Write implements side: b is written now (sealed into TLS records on this
// goroutine when the side has TLS); what the socket does not take waits for
// the writer goroutine. It never blocks.
func (k *connSide) Write(b []byte) (int, error) {
	k.mu.Lock()
	closing := k.closing
	k.mu.Unlock()
	if closing {
		return 0, net.ErrClosed
	}
	if k.c == net.Conn(k.raw) {
		return k.raw.Write(b)
	}
	n := 0
	for len(b) > 0 {
		m := min(len(b), sealPiece)
		k.raw.gather()
		_, err := k.c.Write(b[:m])
		k.raw.release()
		if err != nil {
			return n, err
		}
		n += m
		b = b[m:]
	}
	return n, nil
}

// socketClosed stops a parked reader's wait: the writer closed the
// connection (the side closed, or a write failed). Runs on the writer.
func (k *connSide) socketClosed() {
	k.mu.Lock()
	k.closing = true
	k.cond.Broadcast()
	k.mu.Unlock()
}

// OutboundBuffered implements side.
func (k *connSide) OutboundBuffered() int { return k.raw.buffered() }

// Close implements side: what is queued is written (bounded by
// closeFlushTimeout), then the connection closes and finish runs.
func (k *connSide) Close() {
	k.mu.Lock()
	k.closing = true
	k.cond.Broadcast()
	k.mu.Unlock()
	k.raw.closeAfterSpill()
}

// finish reports the side closed for good to the session, once. Runs on the loop.
func (k *connSide) finish(err error) {
	if k.gone {
		return
	}
	k.gone = true
	k.Close()
	if k.inBase != nil {
		k.raw.arrays.put(k.inBase)
	}
	k.in, k.inBase = nil, nil
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

// FlushOut implements side; raw's writer goroutine writes on its own.
func (k *connSide) FlushOut() error { return nil }
