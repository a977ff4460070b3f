package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// Session states. A session is owned by its client's event loop; state and
// every field not marked atomic are touched only there.
const (
	stAwaitConnect = iota // nothing received yet; the first frame must be CONNECT
	stDialing             // CONNECT received, broker being dialled
	stHandshake           // CONNECT sent to the broker, waiting for CONNECTED
	stEstablished         // forwarding
	stClosed
)

var stateNames = [...]string{"await_connect", "dialing", "handshake", "established", "closed"}

// end is one side of a session; a transport's connection context points to it.
type end struct {
	s   *session
	dir direction // direction of the frames read on this side
}

// session is a client connection and its broker connection.
type session struct {
	srv        *Server
	id         uint64
	shard      uint32
	exec       executor // runs tasks on the session's goroutine (the transport's loop)
	client     side     // immutable after newSession
	clientAddr string
	clientEnd  end
	brokerEnd  end

	// Touched by the ticker goroutine (taskQueued by the resume timer's too).
	handshakeDeadline atomic.Int64
	lastActive        atomic.Int64
	pausedAny         atomic.Bool
	offLoop           atomic.Int32 // sockets parked or in transit (sock.go)
	taskQueued        atomic.Bool  // a resumeAsync task is queued
	closeQueued       atomic.Bool  // a closeAsync task is queued
	// pathDeadline is the ProducerPath's NextDeadline (unix ns, 0 = none),
	// published for the ticker; tickQueued dedups its tick tasks.
	pathDeadline atomic.Int64
	tickQueued   atomic.Bool
	// ksDeadline (unix ns, 0 = none) is the earliest deadline of the session's managed
	// Key_Shared consumers (keyshared.go); ksTickQueued as tickQueued.
	ksDeadline   atomic.Int64
	ksTickQueued atomic.Bool
	// drainDeadline (unix ns, 0 = none) bounds how long the broker side stays
	// open after the client left with chunks in flight (clientGone).
	drainDeadline atomic.Int64

	// Loop-owned.
	state  int
	broker side // nil until the broker conn opens
	// heldPub is the bytes this session held when it last told the server's
	// memory budget (publishHeld).
	heldPub      int64
	brokerAddr   string // written by the dial goroutine before Enroll
	maxMsg       int
	hardLimit    int
	connectFrame []byte
	need         [2]int
	paused       [2]bool
	lookupsOut   int64
	// lookupRefusals rate-limits the log line of refused lookups (lograte.go).
	lookupRefusals logEvery
	reason         error
	path           ProducerPath
	cmd            pulsarpb.BaseCommand
	scratch        []byte
	producers      map[uint64]string // producer id -> topic, for logs
	ids            idAllocator       // the ids of the proxy's own requests (ids.go)
	clientGone     bool              // the client closed; the broker side drains chunk receipts
	timer          *time.Timer       // fires tickAsync at the path's deadline
	timerAt        int64             // when timer is armed for (unix ns), 0 = not armed
	// resumeTimer runs resumeAsync while the session needsResume; needSince
	// is when that began (unix ns), for the checks' pace (backpressure.go).
	resumeTimer *time.Timer
	needSince   int64
	consumers   map[uint64]string // consumer id -> topic, for logs
	// Managed Key_Shared consumers (keyshared.go): by consumer id, by the request id of what
	// is at the broker for them, and a scratch list of acknowledged entries.
	ks     map[uint64]*managedConsumer
	ksReqs map[uint64]*managedConsumer
	ksIDs  []wire.EntryID

	// Pump state while a batch of frames is being processed, so Outputs
	// can flush the pending run of forwarded frames before writing.
	pumpDst  side
	pumpBuf  []byte
	pumpRun  int
	pumpOff  int
	pumpDir  direction
	pumpFail error
	gather   *[]byte // frames made towards pumpDst, gathered into the pump's write (gather.go)

	// Cut-through (contract 8). through[d] counts the bytes still to come
	// from the source of direction d of a frame whose start has already
	// been forwarded; held[d] keeps the frames the proxy itself writes
	// towards that side meanwhile, so none lands inside that frame.
	through [2]int
	held    [2][]byte
	// backlog is the path's Backlogger, nil if it has none; backlogHeld is set
	// while the client's frames wait for it (resumed by resumeClient, driven by
	// receipts and ticks, not by the resume checks of buffer pauses).
	backlog     Backlogger
	backlogHeld bool

	// Lookup redirects followed by the proxy (lookup.go). Loop-owned.
	lookupConnect []byte                    // the CONNECT the broker got, for follow connections
	lookupReqs    map[uint64]*pendingLookup // client LOOKUPs awaiting an answer, by request id
	followCtx     context.Context           // cancelled when the session closes
	followCancel  context.CancelFunc

	// Set by the transport before any input. dial, when set, replaces the
	// server's dialBroker (the net.Conn transport dials its own way);
	// tlsClient: the client came over TLS, so lookup answers give it a
	// pulsar+ssl:// broker URL (brokerServiceUrlTls) to name in its CONNECT.
	dial      func(s *session, targets []string)
	tlsClient bool
	// pinnedBroker, when set, is where a CONNECT naming no
	// proxy_to_broker_url goes: the client came to a per-broker port
	// (broker_ports.go).
	pinnedBroker string
	// clientCertVerified and clientCertRole: the TLS client presented a certificate the
	// listener verified, and the role it names (proxy_role.go). Set before the first frame.
	clientCertVerified bool
	clientCertRole     string
	// proxyRole: the broker connection is authenticated with the proxy's own credential on the
	// client's behalf (proxy_role.go); the proxy answers the broker's AUTH_CHALLENGE itself.
	proxyRole      bool
	clientProtocol int32 // the protocol version the client's CONNECT names
}

// newSession starts the session of a client accepted by a transport; the
// transport sets s.client (its side for s.clientEnd) before any input.
func newSession(srv *Server, exec executor, clientAddr string) *session {
	s := &session{
		srv:        srv,
		id:         srv.nextID.Add(1),
		exec:       exec,
		clientAddr: clientAddr,
		maxMsg:     srv.cfg.MaxMessageSize,
	}
	s.shard = uint32(s.id)
	s.clientEnd = end{s: s, dir: toBroker}
	s.brokerEnd = end{s: s, dir: toClient}
	s.hardLimit = srv.cfg.HardBufferLimit
	now := srv.now.Load()
	s.lastActive.Store(now)
	s.handshakeDeadline.Store(now + int64(srv.cfg.HandshakeTimeout))
	return s
}

func (s *session) logger() *slog.Logger {
	l := s.srv.log.With("conn", s.id, "client", s.clientAddr)
	if s.brokerAddr != "" {
		l = l.With("broker", s.brokerAddr)
	}
	return l
}

// peer returns the connection frames of direction d are written to.
func (s *session) peer(d direction) side {
	if d == toBroker {
		return s.broker
	}
	return s.client
}

// source returns the connection frames of direction d are read from.
func (s *session) source(d direction) side {
	if d == toBroker {
		return s.client
	}
	return s.broker
}

// onTraffic runs on the loop for input buffered on e's side.
func (s *session) onTraffic(e *end) action {
	k := e.side()
	if s.state == stClosed || k == nil {
		return keep
	}
	s.lastActive.Store(s.srv.now.Load())
	if s.state == stDialing {
		// CONNECT is on its way; keep whatever else the client sent
		// buffered (bounded) until the broker answers.
		if n := k.InboundBuffered(); n > s.hardLimit {
			return s.fail(fmt.Errorf("%w: %d bytes buffered while dialling", ErrBufferLimit, n))
		}
		return keep
	}
	act := s.pump(k, e.dir)
	s.publishHeld()
	if s.clientGone && act == keep && !s.chunksInFlight() {
		s.logger().Debug("chunk receipts drained after the client left")
		return closeSide
	}
	return act
}

// side returns the side this end reads from (nil before the broker conn opens).
func (e *end) side() side {
	if e.dir == toBroker {
		return e.s.client
	}
	return e.s.broker
}

// chunksInFlight reports whether the producer path still waits for receipts
// of chunks it forwarded (see Server docs on draining after a client leaves).
func (s *session) chunksInFlight() bool {
	d, ok := s.path.(interface{ InFlightChunks() int })
	return ok && d.InFlightChunks() > 0
}

// fail records err as the close reason and returns the action closing the
// conn whose callback is running; onClose closes the other side.
func (s *session) fail(err error) action {
	if s.reason == nil {
		s.reason = err
	}
	return closeSide
}

// closeAsync closes the session from any goroutine.
func (s *session) closeAsync(err error) {
	if !s.closeQueued.CompareAndSwap(false, true) {
		return
	}
	e := s.exec.run(func() {
		s.closeQueued.Store(false)
		if s.state == stClosed {
			return
		}
		switch {
		case errors.Is(err, ErrHandshakeTimeout) && s.state == stEstablished:
			return // raced with CONNECTED
		case errors.Is(err, ErrIdleTimeout) && s.srv.now.Load()-s.lastActive.Load() <= int64(s.srv.cfg.IdleTimeout):
			return
		}
		if s.reason == nil {
			s.reason = err
		}
		if s.clientGone && s.broker != nil {
			s.broker.Close()
			return
		}
		s.client.Close()
	})
	if e != nil {
		s.closeQueued.Store(false)
	}
}

// resumeAsync asks the loop to resume paused directions whose peer has
// drained, and to write what waits for parked sockets; while the session
// still needs it afterwards, the next check is armed (nextResumeCheck).
// Called from the session's resume timer, and from the ticker as a
// fallback; any goroutine may call it.
func (s *session) resumeAsync() {
	if !s.taskQueued.CompareAndSwap(false, true) {
		return
	}
	e := s.exec.run(func() {
		s.taskQueued.Store(false)
		if s.state == stClosed {
			return
		}
		if err := s.tendParked(); err != nil {
			if s.reason == nil {
				s.reason = err
			}
			s.client.Close()
			return
		}
		for d := toBroker; d <= toClient; d++ {
			if !s.paused[d] {
				continue
			}
			dst, src := s.peer(d), s.source(d)
			if dst == nil || src == nil || (!dst.Gone() && dst.OutboundBuffered() > s.srv.softLimit()/2) {
				continue
			}
			s.setPaused(d, false)
			if d == toBroker && s.backlogHeld {
				continue // the client stays parked for its backlog
			}
			s.unparkSource(d)
		}
		s.publishHeld()
		if s.state != stClosed && s.needsResume() {
			s.nextResumeCheck()
		}
	})
	if e != nil {
		s.taskQueued.Store(false)
	}
}

// resumeClient reads from the client again once the producer path's backlog
// no longer holds it back. Called on the loop after frames from the broker
// (receipts) and ticks were handled.
func (s *session) resumeClient() {
	if !s.backlogHeld || s.backlog.Backlogged() {
		return
	}
	s.backlogHeld = false
	if !s.paused[toBroker] {
		s.unparkSource(toBroker)
	}
}

func (s *session) setPaused(d direction, on bool) {
	if s.paused[d] == on {
		return
	}
	before := s.paused[0] || s.paused[1]
	s.paused[d] = on
	after := s.paused[0] || s.paused[1]
	if before != after {
		s.pausedAny.Store(after)
	}
	if on {
		s.srv.m.pauses[d].Add(1)
		s.startResumeChecks()
	}
}

// frameAction is what pump does with a frame after onFrame.
type frameAction uint8

const (
	actForward frameAction = iota // part of the run of original bytes
	actDone                       // handled (written or dropped) by onFrame
	actStop                       // handled; stop reading this side for now
)

// pump reads every complete frame buffered on src, forwards the original
// bytes of untouched frames to the peer in one write per run, and hands
// the rest to onFrame. Runs on the loop.
func (s *session) pump(src side, d direction) action {
	avail := src.InboundBuffered()
	dst := s.peer(d)
	if avail == 0 {
		return keep
	}
	if s.through[d] > 0 {
		if dst != nil && dst.OutboundBuffered() > s.srv.softLimit() {
			s.pause(d)
			return s.checkHard(src, dst, d, avail)
		}
		if err := s.passThrough(src, dst, d, min(avail, s.through[d])); err != nil {
			return s.fail(err)
		}
		if avail = src.InboundBuffered(); avail == 0 {
			return keep
		}
	}
	if d == toBroker && s.backlog != nil && s.backlog.Backlogged() {
		// At a frame boundary: the client's next frames wait for receipts.
		s.holdForBacklog()
		return s.checkHard(src, dst, d, avail)
	}
	if avail < s.need[d] {
		return s.checkHard(src, dst, d, avail)
	}
	if dst != nil && dst.OutboundBuffered() > s.srv.softLimit() {
		s.pause(d)
		return s.checkHard(src, dst, d, avail)
	}
	buf, err := src.Peek(avail)
	if err != nil {
		return s.fail(err)
	}
	s.pumpDst, s.pumpBuf, s.pumpRun, s.pumpOff, s.pumpDir, s.pumpFail = dst, buf, 0, 0, d, nil
	s.need[d] = 0
	ret := keep
	if s.state == stAwaitConnect {
		if err := s.wrongProtocol(buf); err != nil {
			s.pumpBuf, s.pumpDst = nil, nil
			return s.fail(err)
		}
	}
loop:
	for s.pumpOff < len(buf) {
		f, n, err := wire.ReadFrame(buf[s.pumpOff:], s.maxMsg)
		if err == wire.ErrIncomplete {
			if l, ok := s.cutThrough(d, buf[s.pumpOff:]); ok {
				s.through[d] = l - (len(buf) - s.pumpOff)
				s.pumpOff = len(buf)
			}
			break
		}
		if err != nil {
			ret = s.failPump(fmt.Errorf("%s from %s: %w", frameDesc(buf[s.pumpOff:]), sideName(d), err))
			break
		}
		s.srv.m.countFrame(s.shard, d, f.Type(), n)
		act, err := s.onFrame(d, f)
		if err == nil {
			err = s.pumpFail
		}
		if err != nil {
			ret = s.failPump(err)
			break
		}
		// Withhold the client's next frames while receipts catch up (Backlogger).
		backlogged := d == toBroker && s.backlog != nil && isProducerFrame(d, f.Type()) && s.backlog.Backlogged()
		switch act {
		case actForward:
			s.pumpOff += n
		case actDone:
			s.gatherRun()
			s.pumpOff += n
			s.pumpRun = s.pumpOff
		case actStop:
			s.flushRun()
			s.pumpOff += n
			s.pumpRun = s.pumpOff
			break loop
		}
		if backlogged {
			s.holdForBacklog()
			break loop
		}
		if s.pumpFail != nil {
			ret = s.failPump(s.pumpFail)
			break
		}
	}
	if ret == keep {
		s.flushRun()
		if s.pumpFail != nil {
			ret = s.failPump(s.pumpFail)
		}
	}
	if s.pumpOff > 0 { // gnet's Discard(0) discards everything
		src.Discard(s.pumpOff)
	}
	s.pumpBuf, s.pumpDst = nil, nil
	if d == toClient && ret == keep {
		s.resumeClient()
	}
	if ret == keep && s.state != stClosed {
		return s.checkHard(src, s.peer(d), d, src.InboundBuffered())
	}
	return ret
}

// httpMethods are the starts of HTTP requests (the method and its space).
var httpMethods = []string{"GET ", "POST ", "PUT ", "HEAD ", "DELETE ", "OPTIONS ", "PATCH "}

// wrongProtocol recognises a client that has the wrong port from its first
// bytes b: an HTTP request (read as a frame it would be a gigabyte long) or
// a TLS handshake record. It names the port to use.
func (s *session) wrongProtocol(b []byte) error {
	for _, m := range httpMethods {
		if len(b) >= len(m) && string(b[:len(m)]) == m || len(b) < len(m) && string(b) == m[:len(b)] && len(b) >= 4 {
			web := s.srv.cfg.WebListen
			if web == "" {
				web = "none configured: web-listen"
			}
			return fmt.Errorf("%w: an HTTP request (%q) on the binary port; HTTP goes to the web port (%s)", ErrWrongProtocol, strings.TrimSpace(m), web)
		}
	}
	if len(b) >= 3 && b[0] == 0x16 && b[1] == 0x03 { // TLS handshake record, version 3.x
		tlsPort := s.srv.cfg.TLSListen
		if tlsPort == "" {
			tlsPort = "none configured: tls-listen"
		}
		return fmt.Errorf("%w: a TLS handshake on the plaintext port; pulsar+ssl:// goes to the TLS port (%s)", ErrWrongProtocol, tlsPort)
	}
	return nil
}

// cutThrough decides whether the incomplete frame at the start of b goes
// on as its bytes arrive; it returns the frame's length if so. Only SEND
// (when the producer path agrees from the command alone) and MESSAGE
// qualify: the frames that are large, and that the proxy forwards
// unchanged. Otherwise it sets need[d] to the bytes to wait for: the
// command when a decision may still come from it, else the whole frame.
// Runs on the loop.
func (s *session) cutThrough(d direction, b []byte) (int, bool) {
	l, err := wire.FrameLen(b, s.maxMsg)
	if err != nil {
		s.need[d] = 4
		return 0, false
	}
	s.need[d] = l
	if l < minCutThrough {
		return 0, false // gathering a small frame costs less than a second write
	}
	if s.state != stEstablished || len(b) < 8 {
		if s.state == stEstablished {
			s.need[d] = min(l, 8)
		}
		return 0, false
	}
	h, err := wire.ReadHead(b, s.maxMsg)
	if err == wire.ErrIncomplete {
		s.need[d] = min(l, 8+int(binary.BigEndian.Uint32(b[4:])))
		return 0, false
	}
	if err != nil {
		return 0, false // ReadFrame reports it once the frame is whole
	}
	switch {
	case d == toClient && h.Type == pulsarpb.BaseCommand_MESSAGE:
		if s.ks != nil && s.ksMessage(h.Command) == actDone {
			return 0, false // dropped whole (keyshared.go)
		}
	case d == toBroker && h.Type == pulsarpb.BaseCommand_SEND:
		hf, ok := s.path.(HeadForwarder)
		if !ok || !hf.ForwardHead(h) {
			return 0, false
		}
	default:
		return 0, false
	}
	s.need[d] = 0
	s.srv.m.countFrame(s.shard, d, h.Type, h.Len)
	return h.Len, true
}

// minCutThrough is the smallest frame forwarded as its bytes arrive: a
// smaller one split across reads is gathered, which costs a small copy
// where cutting it through would cost a write of its own.
const minCutThrough = 16 << 10

// maxKeptHeld is the largest held-frames buffer a session keeps for reuse.
const maxKeptHeld = 1 << 20

// passThrough forwards the next k bytes of a cut-through frame from src to
// dst straight from gnet's read buffer, and releases the frames held while
// it was open once its last byte is out. Runs on the loop.
func (s *session) passThrough(src, dst side, d direction, k int) error {
	buf, err := src.Peek(k)
	if err != nil {
		return err
	}
	if !(s.clientGone && d == toClient) {
		if _, err := dst.Write(buf); err != nil {
			return err
		}
	}
	src.Discard(k)
	s.through[d] -= k
	if s.through[d] == 0 && len(s.held[d]) > 0 {
		held := s.held[d]
		s.held[d] = held[:0]
		if cap(held) > maxKeptHeld {
			s.held[d] = nil // a burst; do not keep its buffer for the session's life
		}
		if !(s.clientGone && d == toClient) {
			if _, err := dst.Write(held); err != nil {
				return err
			}
		}
	}
	return nil
}

// flushRun writes the pending run of forwarded frames to the peer.
func (s *session) flushRun() {
	if s.gather != nil {
		if err := s.writeGathered(s.pumpBuf[s.pumpRun:s.pumpOff]); err != nil {
			s.pumpFail = err
		}
		s.pumpRun = s.pumpOff
		return
	}
	if s.clientGone && s.pumpDir == toClient {
		s.pumpRun = s.pumpOff // the client left: its frames go nowhere
		return
	}
	if s.pumpOff > s.pumpRun {
		if s.pumpDst == nil {
			s.pumpFail = fmt.Errorf("%w: frames from %s before the broker connection", ErrOutOfOrder, sideName(s.pumpDir))
		} else if _, err := s.pumpDst.Write(s.pumpBuf[s.pumpRun:s.pumpOff]); err != nil {
			s.pumpFail = err
		}
	}
	s.pumpRun = s.pumpOff
}

// checkHard closes the pair when one direction holds too many bytes.
func (s *session) checkHard(src, dst side, d direction, inbound int) action {
	held := inbound
	if dst != nil {
		held += dst.OutboundBuffered()
	}
	if held > s.hardLimit {
		return s.fail(fmt.Errorf("%w: %d bytes held %s (limit %d); the %s side is not reading and the %s side could not be slowed (it does not read what it is sent either), so closing is the last resort",
			ErrBufferLimit, held, d, s.hardLimit, peerSideName(d), sideName(d)))
	}
	return keep
}

// ToBroker implements Outputs.
func (s *session) ToBroker(b []byte) { s.writeOut(toBroker, b, true) }

// ToClient implements Outputs.
func (s *session) ToClient(b []byte) { s.writeOut(toClient, b, true) }

// writeOut writes frames the proxy made (counted in the frame metrics when
// count is set; a rewrite of a frame already counted is not) towards side d,
// after the pending run and any frame in transit. Runs on the loop.
func (s *session) writeOut(d direction, b []byte, count bool) {
	if s.clientGone && d == toClient {
		s.flushRun()
		return
	}
	dst := s.peer(d)
	if dst == nil {
		s.flushRun()
		s.pumpFail = fmt.Errorf("%w: no %s connection", ErrOutOfOrder, peerSideName(d))
		return
	}
	if t, ok := frameType(b); ok && count {
		s.srv.m.countFrame(s.shard, d, t, len(b))
	}
	if s.gatherOut(d, dst, b) {
		return
	}
	s.flushRun()
	if s.through[d] > 0 {
		// A frame is being cut through towards dst: this one follows it.
		if len(s.held[d])+len(b) > s.hardLimit {
			if s.pumpFail == nil {
				s.pumpFail = fmt.Errorf("%w: %d bytes held behind a frame in transit %s", ErrBufferLimit, len(s.held[d])+len(b), d)
			}
			return
		}
		s.held[d] = append(s.held[d], b...)
		return
	}
	if _, err := dst.Write(b); err != nil && s.pumpFail == nil {
		s.pumpFail = err
	}
}

// onFrame decides what happens to one frame. Runs on the loop.
func (s *session) onFrame(d direction, f wire.Frame) (frameAction, error) {
	t := f.Type()
	if d == toBroker {
		switch s.state {
		case stAwaitConnect:
			if t != pulsarpb.BaseCommand_CONNECT {
				return 0, fmt.Errorf("%w: %s before CONNECT", ErrOutOfOrder, t)
			}
			return s.onConnect(f)
		case stHandshake:
			if t != pulsarpb.BaseCommand_AUTH_RESPONSE {
				return 0, fmt.Errorf("%w: %s from client before CONNECTED", ErrOutOfOrder, t)
			}
			if s.proxyRole {
				return actDone, nil // the broker checks the proxy's credential, not the client's
			}
			return actForward, nil
		}
		if t == pulsarpb.BaseCommand_CONNECT || brokerOnly(t) {
			return 0, fmt.Errorf("%w: %s from client on an established connection", ErrOutOfOrder, t)
		}
		switch t {
		case pulsarpb.BaseCommand_LOOKUP, pulsarpb.BaseCommand_PARTITIONED_METADATA:
			return s.onLookupRequest(f)
		case pulsarpb.BaseCommand_AUTH_RESPONSE:
			if s.proxyRole {
				return actDone, nil // the broker checks the proxy's credential, not the client's
			}
			s.noteAuthResponse(f)
		case pulsarpb.BaseCommand_SUBSCRIBE:
			if c := s.noteSubscribe(f); c != nil && s.managedSubscribe(c) {
				return actDone, nil // held for its buckets (keyshared.go)
			}
		case pulsarpb.BaseCommand_FLOW, pulsarpb.BaseCommand_ACK, pulsarpb.BaseCommand_REDELIVER_UNACKNOWLEDGED_MESSAGES,
			pulsarpb.BaseCommand_CLOSE_CONSUMER:
			if s.ks != nil && s.ksFromClient(f) == actDone {
				return actDone, nil
			}
		case pulsarpb.BaseCommand_PRODUCER:
			s.noteProducer(f)
		}
		if isProducerFrame(d, t) {
			return s.toPath(d, f)
		}
		return actForward, nil
	}

	// From the broker.
	if s.state == stHandshake {
		switch t {
		case pulsarpb.BaseCommand_CONNECTED:
			return s.onConnected(f)
		case pulsarpb.BaseCommand_AUTH_CHALLENGE:
			if s.proxyRole {
				return actDone, s.answerChallenge()
			}
			return actForward, nil
		case pulsarpb.BaseCommand_ERROR:
			// The broker refused the CONNECT (e.g. bad credentials): relay
			// its own error, then close; the broker closes its side too.
			s.flushRun()
			if _, err := s.client.Write(f.Bytes()); err != nil {
				return 0, err
			}
			if s.reason == nil {
				s.reason = fmt.Errorf("broker refused CONNECT: %s", errorText(f, &s.cmd))
			}
			s.client.Close()
			return actStop, nil
		}
		return 0, fmt.Errorf("%w: %s from broker before CONNECTED", ErrOutOfOrder, t)
	}
	switch t {
	case pulsarpb.BaseCommand_CONNECTED, pulsarpb.BaseCommand_CONNECT:
		return 0, fmt.Errorf("%w: %s from broker on an established connection", ErrOutOfOrder, t)
	case pulsarpb.BaseCommand_LOOKUP_RESPONSE:
		return s.onLookupResponse(f)
	case pulsarpb.BaseCommand_PARTITIONED_METADATA_RESPONSE:
		s.lookupDone()
		s.srv.m.lookups[lookupPartitionedMetadata].Add(1)
	case pulsarpb.BaseCommand_SEND_ERROR:
		s.noteSendError(f)
	case pulsarpb.BaseCommand_AUTH_CHALLENGE:
		if s.proxyRole {
			s.flushRun()
			return actDone, s.answerChallenge()
		}
	case pulsarpb.BaseCommand_CLOSE_PRODUCER, pulsarpb.BaseCommand_CLOSE_CONSUMER:
		s.learnAssignedBroker(f)
	}
	if s.ks != nil || s.ksReqs != nil {
		switch t {
		case pulsarpb.BaseCommand_MESSAGE, pulsarpb.BaseCommand_SUCCESS, pulsarpb.BaseCommand_ERROR, pulsarpb.BaseCommand_CLOSE_CONSUMER:
			if s.ksFromBroker(f) == actDone {
				return actDone, nil
			}
		}
	}
	if isProducerFrame(d, t) {
		return s.toPath(d, f)
	}
	return actForward, nil
}

func (s *session) toPath(d direction, f wire.Frame) (frameAction, error) {
	var v Verdict
	var err error
	if d == toBroker {
		v, err = s.path.FromClient(f, s)
	} else {
		v, err = s.path.FromBroker(f, s)
	}
	s.notePathDeadline()
	if err != nil {
		return 0, err
	}
	if v == Consumed {
		return actDone, nil
	}
	return actForward, nil
}

// notePathDeadline arms the session's timer for the ProducerPath's next
// deadline (a batch's max delay), so the flush happens on time whatever the
// ticker's pace. Runs on the loop.
func (s *session) notePathDeadline() {
	d := s.path.NextDeadline()
	if d.IsZero() {
		s.pathDeadline.Store(0)
		return
	}
	ns := d.UnixNano()
	s.pathDeadline.Store(ns)
	if s.timerAt != 0 && s.timerAt <= ns {
		return // armed early enough already
	}
	s.timerAt = ns
	wait := d.Sub(s.srv.clock())
	if s.timer == nil {
		s.timer = time.AfterFunc(wait, s.onTimer)
		return
	}
	s.timer.Reset(wait)
}

// onTimer runs on a timer goroutine when the path's deadline is due.
func (s *session) onTimer() { s.tickAsync() }

// recoverAndClose turns a panic in producer-path code run outside OnTraffic
// (ticks, close) into a logged, counted internal error that closes this pair
// only. Deferred on the loop.
func (s *session) recoverAndClose() {
	v := recover()
	if v == nil {
		return
	}
	s.srv.m.panics.Add(1)
	s.logger().Error("BUG: panic in the producer path; closing the connection", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
	if s.reason == nil {
		s.reason = fmt.Errorf("%w: %v", ErrInternal, v)
	}
	s.client.Close()
	if s.broker != nil {
		s.broker.Close()
	}
}

// chunkDrainTime bounds the broker side's drain after the client left.
const chunkDrainTime = 10 * time.Second

// tickAsync asks the loop to run the ProducerPath's Tick. Called from the
// ticker goroutine once pathDeadline has passed.
func (s *session) tickAsync() {
	if !s.tickQueued.CompareAndSwap(false, true) {
		return
	}
	e := s.exec.run(func() {
		s.tickQueued.Store(false)
		s.timerAt = 0
		if s.state != stEstablished || s.path == nil {
			return
		}
		defer s.recoverAndClose()
		s.pumpFail = nil
		err := s.path.Tick(s.srv.clock(), s)
		if err == nil {
			err = s.pumpFail
		}
		s.notePathDeadline()
		s.resumeClient()
		if err != nil {
			if s.reason == nil {
				s.reason = err
			}
			s.client.Close()
		}
	})
	if e != nil {
		s.tickQueued.Store(false)
	}
}

// onConnect handles the client's CONNECT: pick and check the target, keep
// the CONNECT (proxy_to_broker_url stripped) for the broker, start dialling.
func (s *session) onConnect(f wire.Frame) (frameAction, error) {
	if err := wire.DecodeCommand(f, &s.cmd); err != nil {
		return 0, err
	}
	c := s.cmd.GetConnect()
	if c == nil {
		return 0, wire.ErrMalformedCommand
	}
	s.clientProtocol = c.GetProtocolVersion()
	if c.GetAuthMethodName() == authMethodTLS {
		refusal, err := s.authenticateTLSClient(c)
		if err != nil {
			s.refuse(pulsarpb.ServerError_ServiceNotReady, "The proxy cannot authenticate to the broker.")
			return actStop, err
		}
		if refusal != "" {
			s.refuse(pulsarpb.ServerError_AuthenticationError, refusal)
			return actStop, fmt.Errorf("%w: %s", ErrClientAuthRefused, refusal)
		}
	}
	var targets []string
	u := c.GetProxyToBrokerUrl()
	if u != "" {
		addr, err := BrokerAddress(u)
		if err != nil || !s.srv.known.allowed(addr) {
			s.refuse(pulsarpb.ServerError_ServiceNotReady, "Target broker cannot be validated.")
			return actStop, fmt.Errorf("%w: proxy_to_broker_url %q", ErrTargetRefused, u)
		}
		targets = []string{addr}
		c.ProxyToBrokerUrl = nil
	} else if s.pinnedBroker != "" {
		targets = []string{s.pinnedBroker}
	} else {
		k := s.srv.known
		start := k.rr.Add(1)
		for i := range k.services {
			targets = append(targets, k.nextService(start, i))
		}
	}
	if u != "" || s.proxyRole {
		frame, err := wire.AppendCommandFrame(nil, &s.cmd)
		if err != nil {
			return 0, err
		}
		s.connectFrame = frame
	} else {
		s.connectFrame = append([]byte(nil), f.Bytes()...)
	}
	s.keepConnectForLookups()
	if s.srv.log.Enabled(context.Background(), slog.LevelDebug) {
		s.logger().Debug("CONNECT", "client_version", c.GetClientVersion(), "protocol_version", c.GetProtocolVersion(),
			"auth_method", c.GetAuthMethodName(), "proxy_to_broker_url", u, "targets", targets)
	}
	s.state = stDialing
	if s.dial != nil {
		s.dial(s, targets)
	} else {
		s.srv.dialBroker(s, targets)
	}
	return actStop, nil
}

// dialFailed answers the client's CONNECT with ServiceNotReady when no
// target could be reached. Any goroutine (the transports' dialers).
func (s *session) dialFailed(err error) {
	derr := fmt.Errorf("%w: %v", ErrBrokerUnreachable, err)
	_ = s.exec.run(func() {
		if s.state != stDialing {
			return
		}
		if s.reason == nil {
			s.reason = derr
		}
		s.refuse(pulsarpb.ServerError_ServiceNotReady, "Unable to connect to the broker")
	})
}

// refuse answers the client's CONNECT with an ERROR, as Pulsar's proxy does,
// and closes the client once it is written.
func (s *session) refuse(code pulsarpb.ServerError, msg string) {
	reqID := uint64(math.MaxUint64) // -1: the error answers no request
	cmd := pulsarpb.BaseCommand{
		Type:  pulsarpb.BaseCommand_ERROR.Enum(),
		Error: &pulsarpb.CommandError{RequestId: &reqID, Error: code.Enum(), Message: &msg},
	}
	b, err := wire.AppendCommandFrame(nil, &cmd)
	if err == nil {
		s.srv.m.countFrame(s.shard, toClient, pulsarpb.BaseCommand_ERROR, len(b))
		_, _ = s.client.Write(b)
	}
	s.client.Close()
}

// onBrokerOpen runs on the loop when the transport's broker connection is
// ready; b is its side for s.brokerEnd. It returns the bytes to write to it
// first (the CONNECT), or ok false if the session no longer wants it (the
// transport then closes it).
func (s *session) onBrokerOpen(b side) (out []byte, ok bool) {
	s.srv.m.connsTotal[1].Add(1)
	s.srv.m.connsOpen[1].Add(1)
	if s.state != stDialing {
		return nil, false
	}
	s.broker = b
	s.state = stHandshake
	out = s.connectFrame
	s.connectFrame = nil
	if t, ok := frameType(out); ok {
		s.srv.m.countFrame(s.shard, toBroker, t, len(out))
	}
	if s.client.InboundBuffered() > 0 {
		s.client.Wake()
	}
	return out, true
}

// onConnected relays CONNECTED and switches to forwarding. The broker's
// max_message_size becomes this pair's frame limit.
func (s *session) onConnected(f wire.Frame) (frameAction, error) {
	if err := wire.DecodeCommand(f, &s.cmd); err != nil {
		return 0, err
	}
	if m := s.cmd.GetConnected().GetMaxMessageSize(); m > 0 {
		s.maxMsg = int(m)
	} else {
		s.maxMsg = wire.DefaultMaxMessageSize
	}
	if h := s.srv.cfg.SoftBufferLimit + wire.MaxFrameLen(s.maxMsg); h > s.hardLimit {
		s.hardLimit = h
	}
	s.state = stEstablished
	s.handshakeDeadline.Store(0)
	s.path = s.srv.cfg.ProducerPaths(ConnInfo{ID: s.id, ClientAddr: s.clientAddr, BrokerAddr: s.brokerAddr, MaxMessageSize: s.maxMsg,
		NewID: s.ids.next, Now: s.srv.clock})
	s.backlog, _ = s.path.(Backlogger)
	s.logger().Debug("connected", "server_version", s.cmd.GetConnected().GetServerVersion(),
		"protocol_version", s.cmd.GetConnected().GetProtocolVersion(), "max_message_size", s.maxMsg)
	if s.client.InboundBuffered() > 0 {
		s.client.Wake()
	}
	return actForward, nil
}

// onLookupRequest applies the bound on concurrent lookups.
func (s *session) onLookupRequest(f wire.Frame) (frameAction, error) {
	m := s.srv.m
	// The connection's own bound first, so a flooding client does not take the shared slots.
	bound := "connection"
	if s.lookupsOut < int64(s.srv.cfg.MaxConnectionLookups) {
		bound = "proxy"
		if m.lookupsFlight.Add(1) <= int64(s.srv.cfg.MaxConcurrentLookups) {
			s.lookupsOut++
			s.noteLookup(f)
			return actForward, nil
		}
		m.lookupsFlight.Add(-1)
	}
	m.lookups[lookupThrottled].Add(1)
	if err := wire.DecodeCommand(f, &s.cmd); err != nil {
		return 0, err
	}
	code, msg := pulsarpb.ServerError_TooManyRequests, "Failed due to too many pending lookup requests"
	var reply pulsarpb.BaseCommand
	if l := s.cmd.GetLookupTopic(); l != nil {
		reply.Type = pulsarpb.BaseCommand_LOOKUP_RESPONSE.Enum()
		reply.LookupTopicResponse = &pulsarpb.CommandLookupTopicResponse{
			RequestId: l.RequestId, Response: pulsarpb.CommandLookupTopicResponse_Failed.Enum(), Error: code.Enum(), Message: &msg,
		}
	} else if p := s.cmd.GetPartitionMetadata(); p != nil {
		reply.Type = pulsarpb.BaseCommand_PARTITIONED_METADATA_RESPONSE.Enum()
		reply.PartitionMetadataResponse = &pulsarpb.CommandPartitionedTopicMetadataResponse{
			RequestId: p.RequestId, Response: pulsarpb.CommandPartitionedTopicMetadataResponse_Failed.Enum(), Error: code.Enum(), Message: &msg,
		}
	} else {
		return 0, wire.ErrMalformedCommand
	}
	b, err := wire.AppendCommandFrame(s.scratch[:0], &reply)
	if err != nil {
		return 0, err
	}
	s.scratch = b
	s.ToClient(b)
	if ok, suppressed := s.lookupRefusals.allow(time.Unix(0, s.srv.now.Load())); ok {
		s.logger().Warn("lookup refused: too many concurrent lookups (logged at most once per 10 s per connection)",
			"bound", bound, "connection_limit", s.srv.cfg.MaxConnectionLookups, "proxy_limit", s.srv.cfg.MaxConcurrentLookups,
			"in_flight_on_connection", s.lookupsOut, "suppressed_since_last", suppressed)
	}
	return actDone, nil
}

func (s *session) lookupDone() {
	if s.lookupsOut > 0 {
		s.lookupsOut--
		s.srv.m.lookupsFlight.Add(-1)
	}
}

// onLookupResponse rewrites the answer so the client stays on the proxy,
// or follows a Redirect itself (lookup.go).
func (s *session) onLookupResponse(f wire.Frame) (frameAction, error) {
	if following, err := s.takeRedirect(f); err != nil || following {
		return actDone, err
	}
	s.lookupDone()
	b, addr, result, err := rewriteLookupResponse(s.scratch[:0], f, &s.cmd, s.tlsClient, s.srv.brokerTLS != nil)
	if err != nil {
		return 0, err
	}
	s.scratch = b
	s.srv.m.lookups[result].Add(1)
	if addr != "" {
		s.srv.known.learn(addr)
	}
	if s.srv.log.Enabled(context.Background(), slog.LevelDebug) {
		r := s.cmd.GetLookupTopicResponse()
		s.logger().Debug("lookup answer", "request_id", r.GetRequestId(), "response", r.GetResponse().String(),
			"broker_url", r.GetBrokerServiceUrl(), "error", r.GetError().String())
	}
	s.writeOut(toClient, b, false) // nothing when the client has left; errors surface through pumpFail
	return actDone, nil
}

// learnAssignedBroker learns the broker a CLOSE_PRODUCER or CLOSE_CONSUMER
// names in assigned_broker_service_url (extensible load manager: the topic
// moved there). Clients that know they are proxied reconnect through the
// proxy with that broker in proxy_to_broker_url instead of looking the topic
// up again, so the allow-list must already hold it; the frame itself is
// forwarded unchanged. Runs on the loop (these frames are rare).
func (s *session) learnAssignedBroker(f wire.Frame) {
	if wire.DecodeCommand(f, &s.cmd) != nil {
		return
	}
	var u string
	if c := s.cmd.GetCloseProducer(); c != nil {
		u = c.GetAssignedBrokerServiceUrl()
	} else if c := s.cmd.GetCloseConsumer(); c != nil {
		u = c.GetAssignedBrokerServiceUrl()
	}
	if a := addrOf(u); a != "" {
		s.srv.known.learn(a)
		s.logger().Info("broker moved a topic; its new broker is an allowed target", "command", f.Type().String(), "assigned_broker", u)
	}
}

// noteProducer remembers a producer's topic for logs.
func (s *session) noteProducer(f wire.Frame) {
	if wire.DecodeCommand(f, &s.cmd) != nil {
		return
	}
	p := s.cmd.GetProducer()
	if s.producers == nil {
		s.producers = map[uint64]string{}
	}
	if len(s.producers) < 65536 {
		s.producers[p.GetProducerId()] = p.GetTopic()
	}
	s.logger().Debug("PRODUCER", "topic", p.GetTopic(), "producer_id", p.GetProducerId(), "producer_name", p.GetProducerName())
}

// noteSubscribe remembers a consumer's topic for logs and returns the decoded command (nil
// when it does not decode; the broker judges it).
func (s *session) noteSubscribe(f wire.Frame) *pulsarpb.CommandSubscribe {
	if wire.DecodeCommand(f, &s.cmd) != nil {
		return nil
	}
	c := s.cmd.GetSubscribe()
	if s.consumers == nil {
		s.consumers = map[uint64]string{}
	}
	if len(s.consumers) < 65536 {
		s.consumers[c.GetConsumerId()] = c.GetTopic()
	}
	s.logger().Debug("SUBSCRIBE", "topic", c.GetTopic(), "consumer_id", c.GetConsumerId(),
		"subscription", c.GetSubscription(), "sub_type", c.GetSubType().String())
	return c
}

// noteSendError logs a broker's SEND_ERROR with the producer's topic.
func (s *session) noteSendError(f wire.Frame) {
	if wire.DecodeCommand(f, &s.cmd) != nil {
		return
	}
	e := s.cmd.GetSendError()
	s.logger().Info("SEND_ERROR from broker", "topic", s.producers[e.GetProducerId()], "producer_id", e.GetProducerId(),
		"sequence_id", e.GetSequenceId(), "error", e.GetError().String(), "message", e.GetMessage())
}

// onClose runs on the loop when either side closes for good (gnet's
// OnClose of its conn, or the close of a parked socket); it closes the other.
func (s *session) onClose(e *end, k side, err error) {
	s.srv.m.connsOpen[e.dir].Add(-1) // end toBroker reads the client (side 0)
	if s.state == stClosed {
		return
	}
	if e.dir == toBroker && s.state == stEstablished && s.broker != nil && !s.clientGone && s.through[toBroker] == 0 && s.chunksInFlight() {
		// The client left with chunks unacknowledged. Their receipts tell
		// duplicate-chunk removal where they were stored, so the copies the
		// client resends on its next connection are answered, not stored
		// again: keep the broker side open for them, bounded.
		s.clientGone = true
		s.drainDeadline.Store(s.srv.now.Load() + int64(chunkDrainTime))
		s.logger().Info("client left with chunks in flight; draining their receipts", "limit", chunkDrainTime)
		if g, ok := s.path.(interface{ ClientGone() }); ok {
			g.ClientGone()
		}
		// Consumers must not stay subscribed for a client that left (Exclusive and Failover
		// subscriptions would refuse its reconnect): close them on the broker now.
		var buf []byte
		for id := range s.consumers {
			req := s.ids.next()
			buf, _ = wire.AppendCommandFrame(buf, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_CLOSE_CONSUMER.Enum(),
				CloseConsumer: &pulsarpb.CommandCloseConsumer{ConsumerId: proto.Uint64(id), RequestId: proto.Uint64(req)}})
		}
		if len(buf) > 0 {
			_, _ = s.broker.Write(buf)
		}
		s.ksClose()
		return
	}
	prev := s.state
	s.state = stClosed
	s.drainDeadline.Store(0)
	reason := s.reason
	if reason == nil {
		if n := k.InboundBuffered(); n > 0 {
			reason = fmt.Errorf("%w: %s closed with %d bytes of an incomplete frame", ErrTruncated, sideName(e.dir), n)
		} else if n := s.through[e.dir]; n > 0 {
			reason = fmt.Errorf("%w: %s closed %d bytes before the end of a frame being forwarded", ErrTruncated, sideName(e.dir), n)
		}
	}
	idx := reasonClientClosed
	if e.dir == toClient {
		idx = reasonBrokerClosed
	}
	if reason != nil {
		idx = reasonIndex(reason)
	}
	s.srv.m.closes[idx].Add(1)
	l := s.logger().With("state", stateNames[prev])
	if reason != nil {
		l.Warn("connection closed", "reason", reason.Error())
	} else {
		l.Debug("connection closed", "by", sideName(e.dir), "err", errString(err))
	}
	if e.dir == toBroker {
		if s.broker != nil {
			s.broker.Close()
		}
	} else {
		s.client.Close()
	}
	if s.lookupsOut > 0 {
		s.srv.m.lookupsFlight.Add(-s.lookupsOut)
		s.lookupsOut = 0
	}
	s.stopFollows()
	s.setPaused(toBroker, false)
	s.setPaused(toClient, false)
	s.ksClose()
	if s.path != nil {
		func() {
			defer s.recoverAndClose()
			s.path.Close()
		}()
	}
	s.pathDeadline.Store(0)
	if s.timer != nil {
		s.timer.Stop()
	}
	if s.resumeTimer != nil {
		s.resumeTimer.Stop()
	}
	s.handshakeDeadline.Store(0)
	s.srv.held.Add(-s.heldPub)
	s.heldPub = 0
	s.srv.sessions.Delete(s)
	s.srv.nsessions.Add(-1)
}

func sideName(d direction) string {
	if d == toBroker {
		return "client"
	}
	return "broker"
}

func peerSideName(d direction) string {
	if d == toBroker {
		return "broker"
	}
	return "client"
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// frameType reads the command type of a complete frame the proxy built.
func frameType(b []byte) (pulsarpb.BaseCommand_Type, bool) {
	f, _, err := wire.ReadFrame(b, math.MaxInt32-wire.FramePadding)
	if err != nil {
		return 0, false
	}
	return f.Type(), true
}

// frameDesc describes the start of a bad frame for a log line.
func frameDesc(b []byte) string {
	n := min(len(b), 16)
	return fmt.Sprintf("frame starting % x", b[:n])
}

// errorText renders a CommandError for a log line.
func errorText(f wire.Frame, cmd *pulsarpb.BaseCommand) string {
	if wire.DecodeCommand(f, cmd) != nil {
		return "undecodable ERROR"
	}
	e := cmd.GetError()
	return e.GetError().String() + ": " + e.GetMessage()
}

// brokerOnly reports command types only a broker sends; a client sending
// one is out of order.
func brokerOnly(t pulsarpb.BaseCommand_Type) bool {
	switch t {
	case pulsarpb.BaseCommand_CONNECTED, pulsarpb.BaseCommand_SEND_RECEIPT, pulsarpb.BaseCommand_SEND_ERROR,
		pulsarpb.BaseCommand_MESSAGE, pulsarpb.BaseCommand_SUCCESS, pulsarpb.BaseCommand_ERROR,
		pulsarpb.BaseCommand_PRODUCER_SUCCESS, pulsarpb.BaseCommand_PARTITIONED_METADATA_RESPONSE,
		pulsarpb.BaseCommand_LOOKUP_RESPONSE, pulsarpb.BaseCommand_CONSUMER_STATS_RESPONSE,
		pulsarpb.BaseCommand_REACHED_END_OF_TOPIC, pulsarpb.BaseCommand_GET_LAST_MESSAGE_ID_RESPONSE,
		pulsarpb.BaseCommand_ACTIVE_CONSUMER_CHANGE, pulsarpb.BaseCommand_GET_TOPICS_OF_NAMESPACE_RESPONSE,
		pulsarpb.BaseCommand_GET_SCHEMA_RESPONSE, pulsarpb.BaseCommand_AUTH_CHALLENGE,
		pulsarpb.BaseCommand_ACK_RESPONSE, pulsarpb.BaseCommand_GET_OR_CREATE_SCHEMA_RESPONSE,
		pulsarpb.BaseCommand_WATCH_TOPIC_LIST_SUCCESS, pulsarpb.BaseCommand_WATCH_TOPIC_UPDATE,
		pulsarpb.BaseCommand_TOPIC_MIGRATED:
		return true
	}
	return false
}
