package faultrelay

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"time"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// Matcher selects the client-to-server frames a Rule counts. md is the decoded MessageMetadata
// of a SEND frame, nil for every other frame (and for a SEND whose metadata does not decode).
type Matcher func(f wire.Frame, md *pulsarpb.MessageMetadata) bool

// ChunkSends matches SEND frames whose metadata has chunk_id (PIP-37 chunks).
func ChunkSends(f wire.Frame, md *pulsarpb.MessageMetadata) bool {
	return f.Type() == pulsarpb.BaseCommand_SEND && md != nil && md.ChunkId != nil
}

// Rule cuts a connection after a number of matching client-to-server frames (see the package
// documentation for the exact sequence).
type Rule struct {
	// Match selects the frames counted; nil means ChunkSends.
	Match Matcher
	// After is how many matching frames are forwarded before the cut; it must be >= 1.
	After int
	// HoldFrom is the matching frame (1-based) from whose forwarding on the server's
	// SEND_RECEIPT/SEND_ERROR frames are withheld from the client; 0 means 1. It must be <= After.
	HoldFrom int
	// Drain bounds the wait for the server's answers to every forwarded SEND before both sides
	// are closed; 0 means 5 s.
	Drain time.Duration
	// Connections is how many connections the rule fires on; 0 means 1.
	Connections int
	// BeforeClose, when set, is called after the drain and before both sides are closed, on the
	// cutting connection's client-reading goroutine: the moment the server has answered what
	// was forwarded and the client has seen none of the withheld answers (a test kills the
	// server there, e.g. the proxy process, to die at a known point of the stream).
	BeforeClose func()
}

// Config configures a Relay.
type Config struct {
	// Listen is the relay's listen address; empty means 127.0.0.1:0.
	Listen string
	// Upstream is the server's host:port (a broker or the proxy).
	Upstream string
	// UpstreamAliases are other host:port spellings of Upstream that lookup answers may use.
	UpstreamAliases []string
	// RewriteLookups makes the relay rewrite LOOKUP_RESPONSE broker URLs naming Upstream to
	// its own URL (needed in front of a broker; harmless in front of the proxy).
	RewriteLookups bool
	// RewriteProxiedLookups also rewrites answers that say proxy_through_service_url=true (the
	// standalone broker sets it), for a relay whose client is the proxy: the proxy then dials the
	// relay, not the broker, for the data connections.
	RewriteProxiedLookups bool
	// Rule is the fault; nil relays everything untouched.
	Rule *Rule
	// MaxFrameSize bounds one frame, size prefix included; 0 means 64 MiB.
	MaxFrameSize int
	// DialTimeout bounds dialling Upstream; 0 means 5 s.
	DialTimeout time.Duration
	// Logf, when set, receives one line per connection event and per cut.
	Logf func(format string, args ...any)
	// ToServerRate throttles each connection's client-to-server bytes to this many per second
	// (a slow link towards the server); 0 relays them as fast as they come.
	ToServerRate int
}

// Cut records one firing of the rule.
type Cut struct {
	Conn int // connection number, from 1 in accept order
	// Matched is how many matching frames were forwarded (== Rule.After).
	Matched int
	// SendsForwarded is how many SEND frames (matching or not) the server got on the connection.
	SendsForwarded int
	// Answered is how many SEND_RECEIPT/SEND_ERROR frames the server sent on the connection.
	Answered int
	// Withheld is how many of those never reached the client.
	Withheld int
	// DroppedFromClient is how many client frames were dropped after the cut began (best effort:
	// frames the relay had not read when it closed are not counted).
	DroppedFromClient int
	// Drained is true when the server answered every forwarded SEND before the close.
	Drained bool
}

func (c Cut) String() string {
	return fmt.Sprintf("conn %d: cut after %d matching frames; %d sends forwarded, %d answered by the server, "+
		"%d answers withheld from the client, %d client frames dropped, drained=%t",
		c.Conn, c.Matched, c.SendsForwarded, c.Answered, c.Withheld, c.DroppedFromClient, c.Drained)
}

// Stats counts what the relay did.
type Stats struct {
	Connections         int
	LookupsRewritten    int
	LookupsNotRewritten int // answers naming another broker, or Redirect answers
	LookupsProxied      int // answers with proxy_through_service_url=true, left unchanged
	FramesToServer      int
	FramesToClient      int
}

// Relay is a running fault-injecting relay. Its methods may be called from any goroutine.
type Relay struct {
	cfg  Config
	rule Rule
	ln   net.Listener
	url  string

	mu        sync.Mutex
	conns     map[*session]struct{}
	nextID    int
	claimed   int // connections the rule was assigned to
	cuts      []Cut
	stats     Stats
	closed    bool
	fired     chan struct{}
	firedOnce sync.Once
	wg        sync.WaitGroup
	// holdToClient, while not nil, is a channel closed when server-to-client relaying resumes.
	holdToClient chan struct{}
}

// HoldToClient stops relaying server-to-client bytes on every connection (the relay stops
// reading from the server, as a client that stops reading its socket would) until
// ReleaseToClient.
func (r *Relay) HoldToClient() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.holdToClient == nil {
		r.holdToClient = make(chan struct{})
	}
}

// ReleaseToClient resumes what HoldToClient stopped.
func (r *Relay) ReleaseToClient() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.holdToClient != nil {
		close(r.holdToClient)
		r.holdToClient = nil
	}
}

// waitToClient blocks while server-to-client relaying is held.
func (r *Relay) waitToClient() {
	r.mu.Lock()
	h := r.holdToClient
	r.mu.Unlock()
	if h != nil {
		<-h
	}
}

// Start listens and serves until Close.
func Start(cfg Config) (*Relay, error) {
	if cfg.Upstream == "" {
		return nil, errors.New("faultrelay: Config.Upstream is required")
	}
	if _, _, err := net.SplitHostPort(cfg.Upstream); err != nil {
		return nil, fmt.Errorf("faultrelay: Upstream %q: %w", cfg.Upstream, err)
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.MaxFrameSize <= 0 {
		cfg.MaxFrameSize = 64 << 20
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	r := &Relay{cfg: cfg, conns: map[*session]struct{}{}, fired: make(chan struct{})}
	if cfg.Rule != nil {
		r.rule = *cfg.Rule
		if r.rule.After < 1 {
			return nil, errors.New("faultrelay: Rule.After must be >= 1")
		}
		if r.rule.HoldFrom == 0 {
			r.rule.HoldFrom = 1
		}
		if r.rule.HoldFrom < 1 || r.rule.HoldFrom > r.rule.After {
			return nil, errors.New("faultrelay: Rule.HoldFrom must be in 1..After")
		}
		if r.rule.Match == nil {
			r.rule.Match = ChunkSends
		}
		if r.rule.Drain <= 0 {
			r.rule.Drain = 5 * time.Second
		}
		if r.rule.Connections <= 0 {
			r.rule.Connections = 1
		}
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("faultrelay: %w", err)
	}
	r.ln = ln
	r.url = "pulsar://" + ln.Addr().String()
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

// Addr is the relay's host:port.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// URL is the relay's pulsar:// service URL.
func (r *Relay) URL() string { return r.url }

// Fired is closed once the rule has fired on Rule.Connections connections.
func (r *Relay) Fired() <-chan struct{} { return r.fired }

// Cuts returns the firings so far, in order.
func (r *Relay) Cuts() []Cut {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Cut(nil), r.cuts...)
}

// Stats returns the relay's counters.
func (r *Relay) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// Close stops listening, closes every connection and waits for the relay's goroutines.
func (r *Relay) Close() error {
	r.mu.Lock()
	r.closed = true
	for s := range r.conns {
		s.closeBoth()
	}
	r.mu.Unlock()
	err := r.ln.Close()
	r.wg.Wait()
	return err
}

func (r *Relay) logf(format string, args ...any) {
	if r.cfg.Logf != nil {
		r.cfg.Logf("faultrelay: "+format, args...)
	}
}

func (r *Relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			_ = c.Close()
			return
		}
		r.nextID++
		s := &session{r: r, id: r.nextID, client: c, answered: make(chan struct{}, 1)}
		r.conns[s] = struct{}{}
		r.stats.Connections++
		r.wg.Add(1)
		r.mu.Unlock()
		go s.run()
	}
}

// claim assigns the rule to a connection; false once Rule.Connections connections have it.
func (r *Relay) claim() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cfg.Rule == nil || r.claimed >= r.rule.Connections {
		return false
	}
	r.claimed++
	return true
}

func (r *Relay) recordCut(c Cut) {
	r.mu.Lock()
	r.cuts = append(r.cuts, c)
	done := len(r.cuts) >= r.rule.Connections
	r.mu.Unlock()
	r.logf("%s", c)
	if done {
		r.firedOnce.Do(func() { close(r.fired) })
	}
}

func (r *Relay) count(f func(*Stats)) {
	r.mu.Lock()
	f(&r.stats)
	r.mu.Unlock()
}

// isUpstream says whether a pulsar:// URL names the relay's upstream.
func (r *Relay) isUpstream(u string) bool {
	pu, err := url.Parse(u)
	if err != nil || pu.Host == "" {
		return false
	}
	if pu.Host == r.cfg.Upstream {
		return true
	}
	for _, a := range r.cfg.UpstreamAliases {
		if pu.Host == a {
			return true
		}
	}
	return false
}

// session is one client connection and its server connection.
type session struct {
	r      *Relay
	id     int
	client net.Conn
	server net.Conn

	mu       sync.Mutex
	ruleOn   bool // the rule was assigned to this connection
	decided  bool // whether the rule applies was decided (at the first matching frame)
	matched  int
	sends    int // SEND frames forwarded
	answers  int // SEND_RECEIPT/SEND_ERROR frames from the server
	holding  bool
	cutting  bool
	withheld int
	dropped  int
	answered chan struct{} // poked on every server answer while cutting
	once     sync.Once
}

func (s *session) closeBoth() {
	s.once.Do(func() {
		_ = s.client.Close()
		if s.server != nil {
			_ = s.server.Close()
		}
	})
}

func (s *session) run() {
	defer s.r.wg.Done()
	defer func() {
		s.r.mu.Lock()
		delete(s.r.conns, s)
		s.r.mu.Unlock()
	}()
	srv, err := net.DialTimeout("tcp", s.r.cfg.Upstream, s.r.cfg.DialTimeout)
	if err != nil {
		s.r.logf("conn %d: dial %s: %v", s.id, s.r.cfg.Upstream, err)
		_ = s.client.Close()
		return
	}
	s.r.mu.Lock()
	s.server = srv
	closed := s.r.closed
	s.r.mu.Unlock()
	if closed {
		s.closeBoth()
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.serverToClient()
	}()
	s.clientToServer()
	<-done
}

// readFrame reads one whole frame from br into a fresh buffer.
func readFrame(br *bufio.Reader, maxFrame int) ([]byte, wire.Frame, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return nil, wire.Frame{}, err
	}
	n := int(binary.BigEndian.Uint32(hdr[:])) + 4
	if n > maxFrame {
		return nil, wire.Frame{}, fmt.Errorf("frame of %d bytes exceeds %d", n, maxFrame)
	}
	buf := make([]byte, n)
	copy(buf, hdr[:])
	if _, err := io.ReadFull(br, buf[4:]); err != nil {
		return nil, wire.Frame{}, err
	}
	f, _, err := wire.ReadFrame(buf, maxFrame)
	if err != nil && !errors.Is(err, wire.ErrCorruptFrame) {
		return nil, wire.Frame{}, err
	}
	// A corrupt frame is still relayed as bytes (the server decides); f is then the zero Frame.
	return buf, f, nil
}

func (s *session) clientToServer() {
	defer s.closeBoth()
	br := bufio.NewReaderSize(s.client, 64<<10)
	pace := pacer{rate: s.r.cfg.ToServerRate, start: time.Now()}
	for {
		buf, f, err := readFrame(br, s.r.cfg.MaxFrameSize)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.r.logf("conn %d: client: %v", s.id, err)
			}
			return
		}
		s.mu.Lock()
		if s.cutting {
			s.dropped++
			s.mu.Unlock()
			continue
		}
		isSend := f.Type() == pulsarpb.BaseCommand_SEND
		match := false
		if s.r.cfg.Rule != nil && (!s.decided || s.ruleOn) {
			var md *pulsarpb.MessageMetadata
			if isSend && f.HasPayload() {
				m := &pulsarpb.MessageMetadata{}
				if wire.DecodeMetadata(f.Metadata(), m) == nil {
					md = m
				}
			}
			match = s.r.rule.Match(f, md)
			if match && !s.decided {
				s.decided = true
				s.ruleOn = s.r.claim()
			}
			match = match && s.ruleOn
		}
		cutNow := false
		if match {
			s.matched++
			if s.matched >= s.r.rule.HoldFrom {
				s.holding = true // set before the frame leaves, so its answer is withheld
			}
			if s.matched >= s.r.rule.After {
				s.cutting = true
				cutNow = true
			}
		}
		if isSend {
			s.sends++
		}
		s.mu.Unlock()
		if _, err := s.server.Write(buf); err != nil {
			return
		}
		pace.wait(len(buf))
		s.r.count(func(st *Stats) { st.FramesToServer++ })
		if cutNow {
			s.cut(br)
			return
		}
	}
}

// cut waits for the server's answers to every forwarded send, dropping client frames meanwhile,
// then closes both sides and records the cut.
func (s *session) cut(br *bufio.Reader) {
	// Keep reading (and dropping) the client's frames so that its writes do not block.
	go func() {
		for {
			if _, _, err := readFrame(br, s.r.cfg.MaxFrameSize); err != nil {
				return
			}
			s.mu.Lock()
			s.dropped++
			s.mu.Unlock()
		}
	}()
	deadline := time.NewTimer(s.r.rule.Drain)
	defer deadline.Stop()
	drained, timedOut := s.allAnswered(), false
	for !drained && !timedOut {
		select {
		case <-s.answered:
		case <-deadline.C:
			timedOut = true
		}
		drained = s.allAnswered()
	}
	if s.r.rule.BeforeClose != nil {
		s.r.rule.BeforeClose()
	}
	s.closeBoth()
	s.mu.Lock()
	c := Cut{Conn: s.id, Matched: s.matched, SendsForwarded: s.sends, Answered: s.answers,
		Withheld: s.withheld, DroppedFromClient: s.dropped, Drained: drained}
	s.mu.Unlock()
	s.r.recordCut(c)
}

func (s *session) allAnswered() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.answers >= s.sends
}

func (s *session) serverToClient() {
	defer s.closeBoth()
	br := bufio.NewReaderSize(s.server, 64<<10)
	for {
		s.r.waitToClient()
		buf, f, err := readFrame(br, s.r.cfg.MaxFrameSize)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.r.logf("conn %d: server: %v", s.id, err)
			}
			return
		}
		t := f.Type()
		isAnswer := t == pulsarpb.BaseCommand_SEND_RECEIPT || t == pulsarpb.BaseCommand_SEND_ERROR
		s.mu.Lock()
		if isAnswer {
			s.answers++
		}
		drop := s.cutting || (isAnswer && s.holding)
		if drop && isAnswer {
			s.withheld++
		}
		cutting := s.cutting
		s.mu.Unlock()
		if cutting && isAnswer {
			select {
			case s.answered <- struct{}{}:
			default:
			}
		}
		if drop {
			continue
		}
		if t == pulsarpb.BaseCommand_LOOKUP_RESPONSE && s.r.cfg.RewriteLookups {
			buf = s.rewriteLookup(f, buf)
		}
		if _, err := s.client.Write(buf); err != nil {
			return
		}
		s.r.count(func(st *Stats) { st.FramesToClient++ })
	}
}

// rewriteLookup points a Connect answer naming the upstream at the relay.
func (s *session) rewriteLookup(f wire.Frame, buf []byte) []byte {
	var cmd pulsarpb.BaseCommand
	if err := wire.DecodeCommand(f, &cmd); err != nil {
		return buf
	}
	lr := cmd.GetLookupTopicResponse()
	if lr == nil || lr.GetResponse() != pulsarpb.CommandLookupTopicResponse_Connect || lr.BrokerServiceUrl == nil {
		if lr != nil && lr.GetResponse() == pulsarpb.CommandLookupTopicResponse_Redirect {
			s.r.count(func(st *Stats) { st.LookupsNotRewritten++ })
		}
		return buf
	}
	if lr.GetProxyThroughServiceUrl() && !s.r.cfg.RewriteProxiedLookups {
		s.r.count(func(st *Stats) { st.LookupsProxied++ })
		return buf
	}
	if !s.r.isUpstream(lr.GetBrokerServiceUrl()) {
		s.r.logf("conn %d: lookup answer names %s, not the upstream %s; left unchanged",
			s.id, lr.GetBrokerServiceUrl(), s.r.cfg.Upstream)
		s.r.count(func(st *Stats) { st.LookupsNotRewritten++ })
		return buf
	}
	u := s.r.url
	lr.BrokerServiceUrl = &u
	out, err := wire.AppendCommandFrame(nil, &cmd)
	if err != nil {
		return buf
	}
	s.r.count(func(st *Stats) { st.LookupsRewritten++ })
	return out
}

// pacer holds a direction to rate bytes per second since start (0: unlimited).
type pacer struct {
	rate  int
	start time.Time
	sent  int64
}

func (p *pacer) wait(n int) {
	if p.rate <= 0 {
		return
	}
	p.sent += int64(n)
	due := p.start.Add(time.Duration(float64(p.sent) / float64(p.rate) * float64(time.Second)))
	if d := time.Until(due); d > 0 {
		time.Sleep(d)
	}
}
