package proxy

import (
	"context"
	"fmt"
	"net"
	"os"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"
)

// sock is one side of a session as the session sees it: its gnet conn
// while the socket is on the loop, or its descriptor while the socket is
// parked off the loop so that nobody reads it (backpressure, doc.go
// contract 5).
//
// gnet reads every readable socket on its loop into the conn's inbound
// buffer whether or not the handler consumes it, and has no call to stop
// that. Parking is the lever: the session keeps a duplicate of the
// socket's descriptor and closes the gnet conn (gnet deletes its own
// descriptor from the poller and closes it; the socket lives on in the
// duplicate, since gnet never shuts a socket down). While parked the
// kernel's receive buffer fills and TCP's window closes on the sender, as
// it would on a direct connection to a slow reader. Frames written towards
// a parked socket go straight to the descriptor (non-blocking; what it does
// not take waits in outq and is retried on the session's resume checks,
// backpressure.go). Unparking enrolls the socket on the same loop again;
// the bytes gnet had read but the session had not consumed wait in pre and
// are taken first.
//
// Only a socket with nothing queued for it in gnet can be parked: gnet's
// close writes what is queued once and drops the rest.
//
// Every method runs on the session's loop.
type sock struct {
	e    *end
	c    gnet.Conn      // the conn on the loop; nil while the socket is off it
	loop gnet.EventLoop // the session's loop, where it returns after parking
	mode sockMode
	fd   int // the session's descriptor of the socket while not onLoop, else -1
	// pre holds bytes read before parking and not yet consumed; they come
	// before anything the conn reads after.
	pre []byte
	// outq holds frames written while off the loop that the socket did not
	// take yet; they go out before anything written after.
	outq []byte
	// closeWanted: the session closed this side while its conn was in a
	// transition (leaving or returning); the transition ends in the close.
	closeWanted bool
	// backWanted: unpark as soon as the leaving conn is gone.
	backWanted bool
	// closing: Close was called while on the loop (gnet's close is queued);
	// the socket must not be parked then, or the close would become a park.
	closing bool
}

type sockMode uint8

const (
	onLoop    sockMode = iota // c is gnet's, reads and writes go through it
	leaving                   // c.Close() issued to park; gnet's OnClose pending
	offLoop                   // parked: nobody reads; writes go to fd
	returning                 // Enroll issued; gnet's OnOpen pending
	gone                      // closed for good
)

func newSock(e *end, c gnet.Conn) *sock { return &sock{e: e, c: c, loop: c.EventLoop(), fd: -1} }

// Gone reports whether the socket is closed for good.
func (k *sock) Gone() bool { return k.mode == gone }

// readable reports whether c's inbound buffer belongs to the session.
func (k *sock) readable() bool { return k.c != nil && (k.mode == onLoop || k.mode == leaving) }

// InboundBuffered is the number of bytes read and not yet consumed.
func (k *sock) InboundBuffered() int {
	n := len(k.pre)
	if k.readable() {
		n += k.c.InboundBuffered()
	}
	return n
}

// Peek returns the next n unconsumed bytes (n <= InboundBuffered), valid
// until the next Discard or return to the loop.
func (k *sock) Peek(n int) ([]byte, error) {
	if len(k.pre) == 0 {
		if !k.readable() {
			return nil, nil
		}
		return k.c.Peek(n)
	}
	if n > len(k.pre) && k.readable() && k.c.InboundBuffered() > 0 {
		// Rare: only right after a return to the loop. Glue what the conn
		// read to what was kept, so frames are contiguous.
		b, err := k.c.Next(-1)
		if err != nil {
			return nil, err
		}
		k.pre = append(k.pre, b...)
	}
	return k.pre[:min(n, len(k.pre))], nil
}

// Discard consumes n bytes (n > 0).
func (k *sock) Discard(n int) {
	if p := min(n, len(k.pre)); p > 0 {
		k.pre = k.pre[p:]
		if len(k.pre) == 0 {
			k.pre = nil
		}
		n -= p
	}
	if n > 0 && k.readable() {
		_, _ = k.c.Discard(n)
	}
}

// Write queues b towards the socket, in order with everything before.
func (k *sock) Write(b []byte) (int, error) {
	switch k.mode {
	case onLoop:
		return k.c.Write(b)
	case gone:
		return 0, net.ErrClosed
	}
	if len(k.outq) > 0 {
		k.outq = append(k.outq, b...)
		return len(b), nil
	}
	n, err := unix.Write(k.fd, b)
	switch {
	case err == unix.EAGAIN || err == unix.EINTR:
		n = 0
	case err != nil:
		return 0, err
	}
	if n < len(b) {
		// The socket is full: what it did not take waits for the resume
		// checks, which are restarted so that it waits milliseconds, not the
		// pace they may have slowed to while the socket was parked.
		k.outq = append(k.outq, b[n:]...)
		k.e.s.startResumeChecks()
	}
	return len(b), nil
}

// FlushOut writes what waits in outq while the socket is off the loop.
func (k *sock) FlushOut() error {
	if len(k.outq) == 0 || k.fd < 0 {
		return nil
	}
	n, err := unix.Write(k.fd, k.outq)
	if err != nil && err != unix.EAGAIN && err != unix.EINTR {
		return err
	}
	if n > 0 {
		k.outq = append(k.outq[:0], k.outq[n:]...)
	}
	return nil
}

// OutboundBuffered is the number of bytes written and not yet sent.
func (k *sock) OutboundBuffered() int {
	if k.mode == onLoop {
		return k.c.OutboundBuffered()
	}
	return len(k.outq)
}

// Wake makes the loop call the handler for this side's buffered input.
func (k *sock) Wake() {
	if k.mode == onLoop {
		_ = k.c.Wake(nil)
	}
}

// Close closes this side; the session's onClose runs for it (from gnet's
// OnClose while the conn is on the loop, directly while it is parked).
func (k *sock) Close() {
	switch k.mode {
	case onLoop:
		k.closing = true
		_ = k.c.Close()
	case leaving, returning:
		k.closeWanted = true
	case offLoop:
		k.finish(nil)
	}
}

// finish closes a parked socket for good and tells the session.
func (k *sock) finish(err error) {
	if k.mode != onLoop && k.mode != gone {
		k.e.s.noteOffLoop(-1)
	}
	if k.fd >= 0 {
		// As gnet's close does: write what is queued, once. Then take what
		// the peer sent and nobody read (a parked socket has some), so the
		// close is a FIN, not a reset that would drop what was written.
		_ = k.FlushOut()
		var buf [64 << 10]byte
		for i := 0; i < 256; i++ {
			if n, err := unix.Read(k.fd, buf[:]); n <= 0 || err != nil {
				break
			}
		}
	}
	k.closeFd()
	k.mode = gone
	k.outq = nil
	k.e.s.onClose(k.e, k, err)
	k.pre = nil
}

// gnetExec is the executor of a session on a gnet loop.
type gnetExec struct{ el gnet.EventLoop }

func (g gnetExec) run(f func()) error {
	return g.el.Execute(context.Background(), gnet.RunnableFunc(func(context.Context) error {
		f()
		return nil
	}))
}

func (k *sock) closeFd() {
	if k.fd >= 0 {
		_ = unix.Close(k.fd)
		k.fd = -1
		k.e.s.srv.m.parked.Add(-1)
	}
}

// Park takes the socket off the loop. It reports false, changing nothing,
// when it cannot: not on the loop, or gnet still has bytes queued for it.
func (k *sock) Park() bool {
	if k.mode != onLoop || k.closing || k.c.OutboundBuffered() > 0 {
		return false
	}
	fd, err := k.c.Dup()
	if err != nil {
		return false
	}
	if err := k.c.Close(); err != nil {
		_ = unix.Close(fd)
		return false
	}
	k.fd = fd
	k.mode = leaving
	k.backWanted = false
	k.e.s.srv.m.parked.Add(1)
	k.e.s.srv.m.parks[k.e.dir].Add(1)
	k.e.s.noteOffLoop(+1)
	return true
}

// onGnetClose handles gnet's OnClose of c while the socket is leaving the
// loop; it reports false if c is not the conn of a leaving socket.
func (k *sock) onGnetClose(c gnet.Conn) bool {
	if k.mode != leaving || k.c != c {
		return false
	}
	if n := c.InboundBuffered(); n > 0 {
		b, _ := c.Peek(n)
		k.pre = append(k.pre, b...)
	}
	k.c = nil
	k.mode = offLoop
	switch {
	case k.closeWanted:
		k.finish(nil)
	case k.backWanted:
		k.Unpark()
	}
	return true
}

// Unpark enrolls the socket on the session's loop again; OnOpen completes
// it (onReturn). While the enrolment is under way writes still go to fd.
// On a socket that is on the loop it is Wake.
func (k *sock) Unpark() {
	switch k.mode {
	case onLoop:
		k.Wake()
		return
	case leaving:
		k.backWanted = true
		return
	case offLoop:
	default:
		return
	}
	if err := k.enroll(); err != nil {
		k.finish(fmt.Errorf("%w: returning a parked %s socket to the loop: %v", ErrInternal, sideName(k.e.dir), err))
		return
	}
	k.mode = returning
}

func (k *sock) enroll() error {
	dup, err := unix.Dup(k.fd)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(dup), "parked")
	nc, err := net.FileConn(f) // duplicates again; f's descriptor is ours to close
	_ = f.Close()
	if err != nil {
		return err
	}
	s := k.e.s
	ch, err := k.loop.Enroll(gnet.NewContext(context.Background(), k.e), nc)
	if err != nil {
		_ = nc.Close()
		return err
	}
	go func() {
		res := <-ch
		if res.Err == nil {
			return
		}
		_ = s.exec.run(func() {
			if k.mode == returning {
				k.mode = offLoop
				k.finish(fmt.Errorf("%w: returning a parked %s socket to the loop: %v", ErrInternal, sideName(k.e.dir), res.Err))
			}
		})
	}()
	return nil
}

// onReturn runs in OnOpen when the socket is back on the loop as c. What
// was written meanwhile and not taken goes out first.
func (k *sock) onReturn(c gnet.Conn) ([]byte, gnet.Action) {
	c.SetContext(k.e)
	k.c = c
	k.mode = onLoop
	k.e.s.noteOffLoop(-1)
	k.closeFd()
	out := k.outq
	k.outq = nil
	if k.closeWanted {
		return out, gnet.Close
	}
	if len(k.pre) > 0 {
		_ = c.Wake(nil)
	}
	return out, gnet.None
}
