package proxy

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// The connection core's specs: a session driven on byte slices, without
// sockets or gnet, one spec per contract of doc.go (nats-server style: bytes
// in, bytes out). memSide is a side whose input the spec appends and whose
// output it reads; memLoop runs the session's tasks and closes the way a
// transport's loop would, after the input being handled.

// memSide is an in-memory side.
type memSide struct {
	l      *memLoop
	e      *end
	in     []byte // read, not yet consumed
	out    []byte // everything written
	writes int    // Write calls
	// slow: written bytes stay queued (OutboundBuffered) until drain.
	slow   bool
	queued int
	parked bool
	parks  int
	gone   bool
}

func (m *memSide) InboundBuffered() int { return len(m.in) }
func (m *memSide) Peek(n int) ([]byte, error) {
	if n > len(m.in) {
		return nil, io.ErrShortBuffer
	}
	return m.in[:n], nil
}
func (m *memSide) Discard(n int) { m.in = m.in[n:] }
func (m *memSide) Write(b []byte) (int, error) {
	if m.gone {
		return 0, errors.New("closed")
	}
	m.out = append(m.out, b...)
	m.writes++
	if m.slow {
		m.queued += len(b)
	}
	return len(b), nil
}
func (m *memSide) OutboundBuffered() int { return m.queued }
func (m *memSide) Close() {
	if !m.gone {
		m.l.later(func() { m.closeNow() })
	}
}
func (m *memSide) closeNow() {
	if m.gone {
		return
	}
	m.l.s.onClose(m.e, m, nil)
	m.gone = true
}
func (m *memSide) Wake() { m.l.later(func() { m.l.input(m) }) }
func (m *memSide) Park() bool {
	if m.parked || m.queued > 0 {
		return false
	}
	m.parked = true
	m.parks++
	return true
}
func (m *memSide) Unpark() {
	m.parked = false
	m.Wake()
}
func (m *memSide) Gone() bool      { return m.gone }
func (m *memSide) FlushOut() error { return nil }

// drain lets the side's reader take everything queued.
func (m *memSide) drain() { m.queued = 0 }

// take returns the output written since the last take.
func (m *memSide) take() []byte {
	b := m.out
	m.out = nil
	return b
}

// memLoop is the session's goroutine in a spec: tasks run in order after
// the call that queued them, as on a transport's loop.
type memLoop struct {
	t       *testing.T
	srv     *Server
	s       *session
	client  *memSide
	broker  *memSide
	targets []string   // the dial of the session, if any
	tasksMu sync.Mutex // later may be called from other goroutines (the keyshared manager's timers)
	tasks   []func()
	now     time.Time
	logs    *logBuffer
}

func (l *memLoop) run(f func()) error { l.later(f); return nil }
func (l *memLoop) later(f func()) {
	l.tasksMu.Lock()
	l.tasks = append(l.tasks, f)
	l.tasksMu.Unlock()
}

// settle runs queued tasks until none is left.
func (l *memLoop) settle() {
	for {
		l.tasksMu.Lock()
		if len(l.tasks) == 0 {
			l.tasksMu.Unlock()
			return
		}
		f := l.tasks[0]
		l.tasks = l.tasks[1:]
		l.tasksMu.Unlock()
		f()
	}
}

// input hands m's buffered bytes to the session, as a transport's read
// callback does; a closeSide answer closes m.
func (l *memLoop) input(m *memSide) {
	if m.gone || m.parked {
		return
	}
	if l.s.onTraffic(m.e) == closeSide {
		m.closeNow()
	}
}

// feed appends b to m's input, hands it to the session and settles.
func (l *memLoop) feed(m *memSide, b ...[]byte) {
	for _, p := range b {
		m.in = append(m.in, p...)
	}
	l.input(m)
	l.settle()
}

// newCore returns a session of a server with cfg changed by mod, whose
// client side is connected; the broker side appears when the session dials.
func newCore(t *testing.T, mod func(*Config)) *memLoop {
	t.Helper()
	logs := &logBuffer{}
	cfg := DefaultConfig()
	cfg.Brokers = []string{"broker:6650"}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if mod != nil {
		mod(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l := &memLoop{t: t, srv: srv, now: time.Unix(1_800_000_000, 0), logs: logs}
	srv.clock = func() time.Time { return l.now }
	srv.now.Store(l.now.UnixNano())
	srv.dialBroker = func(s *session, targets []string) {
		l.targets = targets
		l.later(func() {
			l.broker = &memSide{l: l, e: &s.brokerEnd}
			out, ok := s.onBrokerOpen(l.broker)
			if ok {
				_, _ = l.broker.Write(out)
			}
		})
	}
	l.s = newSession(srv, l, "client:1")
	l.client = &memSide{l: l, e: &l.s.clientEnd}
	l.s.client = l.client
	srv.sessions.Store(l.s, struct{}{})
	srv.nsessions.Add(1)
	return l
}

// established is newCore after CONNECT and CONNECTED, outputs taken.
func established(t *testing.T, mod func(*Config)) *memLoop {
	t.Helper()
	l := newCore(t, mod)
	l.feed(l.client, frame(t, connectCmd("")))
	if l.broker == nil {
		t.Fatal("CONNECT did not dial")
	}
	l.feed(l.broker, frame(t, connectedCmd(1<<20)))
	if l.s.state != stEstablished {
		t.Fatalf("state %s after CONNECTED", stateNames[l.s.state])
	}
	l.client.take()
	l.broker.take()
	return l
}

// tick advances the clock by d and runs the server's ticker once.
func (l *memLoop) tick(d time.Duration) {
	l.now = l.now.Add(d)
	l.srv.OnTick()
	l.settle()
}

func lookupResponse(id uint64, url string) *pulsarpb.BaseCommand {
	return &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_LOOKUP_RESPONSE.Enum(), LookupTopicResponse: &pulsarpb.CommandLookupTopicResponse{
		RequestId: proto.Uint64(id), Response: pulsarpb.CommandLookupTopicResponse_Connect.Enum(),
		BrokerServiceUrl: proto.String(url), Authoritative: proto.Bool(true)}}
}

func lookupRequest(id uint64) *pulsarpb.BaseCommand {
	return &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_LOOKUP.Enum(), LookupTopic: &pulsarpb.CommandLookupTopic{
		Topic: proto.String("persistent://t/n/x"), RequestId: proto.Uint64(id)}}
}

// Contract 1, discovery.
// Given an established lookup connection with a LOOKUP in flight,
// when the broker answers Connect naming broker-b:6650,
// then the client gets that answer with proxy_through_service_url=true and broker-b:6650 may now
// be named in a CONNECT's proxy_to_broker_url.
func TestCoreLookupAnswerComesBackThroughTheProxy(t *testing.T) {
	l := established(t, nil)
	l.feed(l.client, frame(t, lookupRequest(7)))
	l.broker.take()

	l.feed(l.broker, frame(t, lookupResponse(7, "pulsar://broker-b:6650")))

	got := decodeAll(t, l.client.take())
	if len(got) != 1 || !got[0].GetLookupTopicResponse().GetProxyThroughServiceUrl() ||
		got[0].GetLookupTopicResponse().GetBrokerServiceUrl() != "pulsar://broker-b:6650" || got[0].GetLookupTopicResponse().GetRequestId() != 7 {
		t.Fatalf("client got %v", got)
	}
	if !l.srv.known.allowed("broker-b:6650") {
		t.Error("the broker named by the answer was not learned")
	}
}

// Contract 2, no open relay.
// Given a fresh connection,
// when its CONNECT names a broker nobody announced in proxy_to_broker_url (either scheme),
// then nothing is dialled, the client gets ERROR(ServiceNotReady, "Target broker cannot be
// validated.") and is closed.
func TestCoreUnknownTargetIsRefusedWithoutDialling(t *testing.T) {
	for _, target := range []string{"pulsar://elsewhere:6650", "pulsar+ssl://elsewhere:6651", "pulsar+ssl://elsewhere"} {
		t.Run(target, func(t *testing.T) {
			l := newCore(t, nil)

			l.feed(l.client, frame(t, connectCmd(target)))

			if l.targets != nil {
				t.Errorf("dialled %v", l.targets)
			}
			got := decodeAll(t, l.client.take())
			if len(got) != 1 || got[0].GetError().GetError() != pulsarpb.ServerError_ServiceNotReady ||
				got[0].GetError().GetMessage() != "Target broker cannot be validated." {
				t.Fatalf("client got %v", got)
			}
			if !l.client.gone || !errors.Is(l.s.reason, ErrTargetRefused) {
				t.Errorf("client closed %v, reason %v", l.client.gone, l.s.reason)
			}
		})
	}
}

// Contract 3, transparency.
// Given an established connection,
// when the client sends three frames in one read and the broker three in another,
// then each side gets the other's bytes unchanged, in one write.
func TestCoreFramesGoThroughAsTheirOriginalBytesInOneWrite(t *testing.T) {
	l := established(t, nil)
	ping := frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PING.Enum(), Ping: &pulsarpb.CommandPing{}})
	flow := frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_FLOW.Enum(), Flow: &pulsarpb.CommandFlow{ConsumerId: proto.Uint64(1), MessagePermits: proto.Uint32(1000)}})
	pong := frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PONG.Enum(), Pong: &pulsarpb.CommandPong{}})
	fromClient := bytes.Join([][]byte{ping, flow, ping}, nil)
	fromBroker := bytes.Join([][]byte{pong, messageFrames(t, 2, 100)}, nil)

	l.feed(l.client, fromClient)
	l.feed(l.broker, fromBroker)

	if got := l.broker.take(); !bytes.Equal(got, fromClient) || l.broker.writes != 2 { // CONNECT + one
		t.Errorf("broker got %d bytes in %d writes; want the client's %d in one", len(got), l.broker.writes-1, len(fromClient))
	}
	if got := l.client.take(); !bytes.Equal(got, fromBroker) || l.client.writes != 2 { // CONNECTED + one
		t.Errorf("client got %d bytes in %d writes; want the broker's %d in one", len(got), l.client.writes-1, len(fromBroker))
	}
}

// Contract 4, protocol checks.
// Given an established connection,
// when the client sends a command only brokers send (SEND_RECEIPT),
// then the pair is closed as out of order and nothing reaches the broker.
func TestCoreBrokerOnlyCommandFromTheClientClosesThePair(t *testing.T) {
	l := established(t, nil)
	receipt := frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_SEND_RECEIPT.Enum(), SendReceipt: &pulsarpb.CommandSendReceipt{
		ProducerId: proto.Uint64(1), SequenceId: proto.Uint64(1)}})

	l.feed(l.client, receipt)

	if !errors.Is(l.s.reason, ErrOutOfOrder) || !l.client.gone || !l.broker.gone {
		t.Errorf("reason %v, client closed %v, broker closed %v", l.s.reason, l.client.gone, l.broker.gone)
	}
	if got := l.broker.take(); len(got) != 0 {
		t.Errorf("broker got %d bytes", len(got))
	}
}

// Contract 5, backpressure.
// Given an established connection (soft limit 64 KiB) whose broker side stops reading,
// when the client sends 200 KB of SENDs and the broker side later drains,
// then the client side is parked once 64 KiB are queued towards the broker (not closed), and
// after the drain and a tick it is read again and the rest reaches the broker.
func TestCoreSlowBrokerParksTheClientUntilItDrains(t *testing.T) {
	l := established(t, bpConfig)
	l.broker.slow = true
	sends := sendFrames(10, 20<<10)
	one := len(sends) / 10

	for i := 0; i < 10; i++ { // one read per frame; a parked side is not read
		l.feed(l.client, sends[i*one:(i+1)*one])
	}

	if !l.client.parked || l.client.gone || !l.s.paused[toBroker] {
		t.Fatalf("client parked %v, closed %v, paused %v", l.client.parked, l.client.gone, l.s.paused[toBroker])
	}
	if q := l.broker.queued; q <= 64<<10 || q >= len(sends) {
		t.Fatalf("%d bytes went to the broker; want the soft limit's worth, not all %d", q, len(sends))
	}
	l.broker.drain()
	l.tick(pausedTick)
	if l.client.parked || !bytes.Equal(l.broker.take(), sends) {
		t.Fatalf("after the drain: client parked %v; broker got everything: %v", l.client.parked, bytes.Equal(l.broker.out, sends))
	}
}

// Contract 5, resuming on time.
// Given an established connection whose slow broker made it park the client, and that has
// stayed so through several of its resume checks,
// when the broker drains and the server's ticker does not run,
// then the client is read again (the session's own resume check, due within pausedTick; a
// second is allowed) and every SEND reaches the broker.
func TestCoreDrainedPauseResumesWithoutWaitingForTheTicker(t *testing.T) {
	l := established(t, bpConfig)
	l.broker.slow = true
	sends := sendFrames(10, 20<<10)
	one := len(sends) / 10
	for i := 0; i < 10; i++ {
		l.feed(l.client, sends[i*one:(i+1)*one])
	}
	for end := time.Now().Add(20 * time.Millisecond); time.Now().Before(end); {
		time.Sleep(time.Millisecond)
		l.settle() // the checks run (about every pausedTick) and find the broker still behind
	}
	if !l.client.parked {
		t.Fatal("precondition: the client is not parked")
	}

	l.broker.drain()

	for end := time.Now().Add(time.Second); l.client.parked && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
		l.settle()
	}
	if l.client.parked || !bytes.Equal(l.broker.take(), sends) {
		t.Fatalf("a second after the drain: client parked %v; broker got everything: %v", l.client.parked, bytes.Equal(l.broker.out, sends))
	}
}

// Contract 5, the pace of resume checks.
// Given a session that has needed a resume check (paused, or a socket parked) for some time,
// when the wait before its next check is chosen,
// then it is a quarter of that time, at least pausedTick and at most tickInterval.
func TestResumeChecksSlowDownWithTheTimeInNeed(t *testing.T) {
	for _, tc := range []struct{ inNeed, want time.Duration }{
		{0, pausedTick},
		{4 * time.Millisecond, pausedTick},
		{40 * time.Millisecond, 10 * time.Millisecond},
		{time.Second, tickInterval},
	} {
		if got := resumeCheckWait(tc.inNeed); got != tc.want {
			t.Errorf("in need %v: wait %v, want %v", tc.inNeed, got, tc.want)
		}
	}
}

// Contract 5, the hard limit as last resort.
// Given an established connection (soft 64 KiB; hard 256 KiB, raised to soft + a frame by the
// broker's 1 MiB max_message_size) whose client side has bytes queued (so it cannot be parked)
// and whose broker side stops reading,
// when the client sends 1.6 MB of SENDs,
// then the pair is closed with ErrBufferLimit naming the last resort.
func TestCoreUnparkableSenderHitsTheHardLimit(t *testing.T) {
	l := established(t, bpConfig)
	l.broker.slow = true
	l.client.queued = 1 // the client does not read what it is sent either
	sends := sendFrames(80, 20<<10)
	one := len(sends) / 80

	for i := 0; i < 80 && !l.client.gone; i++ {
		l.feed(l.client, sends[i*one:(i+1)*one])
	}

	if !errors.Is(l.s.reason, ErrBufferLimit) || !bytes.Contains([]byte(l.s.reason.Error()), []byte("last resort")) || !l.client.gone {
		t.Fatalf("reason %v, client closed %v", l.s.reason, l.client.gone)
	}
}

// Contract 6, timeouts on the injected clock.
// Given a connection whose CONNECT is dialled but not answered,
// when the handshake timeout passes on the session's clock,
// then the pair is closed with ErrHandshakeTimeout.
func TestCoreHandshakeTimesOutOnTheInjectedClock(t *testing.T) {
	l := newCore(t, func(c *Config) { c.HandshakeTimeout = 5 * time.Second })
	l.feed(l.client, frame(t, connectCmd("")))
	l.tick(4 * time.Second)
	if l.client.gone {
		t.Fatal("closed before the timeout")
	}

	l.tick(2 * time.Second)

	if !errors.Is(l.s.reason, ErrHandshakeTimeout) || !l.client.gone || !l.broker.gone {
		t.Fatalf("reason %v, client closed %v, broker closed %v", l.s.reason, l.client.gone, l.broker.gone)
	}
}

// Contract 7, hot path.
// Given an established connection,
// when the client sends a PING and the broker a MESSAGE, many times,
// then forwarding them allocates nothing.
func TestCoreForwardingAllocatesNothing(t *testing.T) {
	l := established(t, nil)
	ping := frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PING.Enum(), Ping: &pulsarpb.CommandPing{}})
	msg := messageFrames(t, 1, 1000)
	l.client.out = make([]byte, 0, 1<<20)
	l.broker.out = make([]byte, 0, 1<<20)
	l.client.in = make([]byte, 0, 1<<16)
	l.broker.in = make([]byte, 0, 1<<16)

	allocs := testing.AllocsPerRun(200, func() {
		l.client.in = append(l.client.in[:0], ping...)
		l.input(l.client)
		l.broker.in = append(l.broker.in[:0], msg...)
		l.input(l.broker)
		l.client.out, l.broker.out = l.client.out[:0], l.broker.out[:0]
	})

	if allocs != 0 {
		t.Errorf("%.1f allocations per PING and MESSAGE forwarded", allocs)
	}
}

// Contract 8, cut-through.
// Given an established connection,
// when the first 20 KB of a 100 KB MESSAGE have arrived from the broker,
// then they are already written to the client, and the rest follows as it arrives.
func TestCoreLargeMessageIsForwardedAsItArrives(t *testing.T) {
	l := established(t, nil)
	msg := messageFrames(t, 1, 100<<10)

	l.feed(l.broker, msg[:20<<10])

	if got := l.client.take(); !bytes.Equal(got, msg[:20<<10]) {
		t.Fatalf("client got %d bytes of the first 20 KiB", len(got))
	}
	l.feed(l.broker, msg[20<<10:])
	if got := l.client.take(); !bytes.Equal(got, msg[20<<10:]) {
		t.Fatalf("client got %d bytes of the remaining %d", len(got), len(msg)-20<<10)
	}
}

// Fairness (contract 5, lookups).
// Given a connection allowed 2 lookups in flight, both unanswered,
// when it sends a third,
// then the proxy answers that one TooManyRequests itself and the broker never sees it.
func TestCoreLookupsBeyondTheConnectionsBoundAreRefused(t *testing.T) {
	l := established(t, func(c *Config) { c.MaxConnectionLookups = 2 })
	l.feed(l.client, frame(t, lookupRequest(1)), frame(t, lookupRequest(2)))
	l.broker.take()

	l.feed(l.client, frame(t, lookupRequest(3)))

	if got := l.broker.take(); len(got) != 0 {
		t.Errorf("broker got %v", decodeAll(t, got))
	}
	got := decodeAll(t, l.client.take())
	if len(got) != 1 || got[0].GetLookupTopicResponse().GetRequestId() != 3 ||
		got[0].GetLookupTopicResponse().GetError() != pulsarpb.ServerError_TooManyRequests {
		t.Fatalf("client got %v", got)
	}
}

// Contract 4, the wrong port.
// Given a fresh connection on the binary port,
// when its first bytes are an HTTP request, or a TLS handshake record,
// then it is closed as the wrong protocol, with a reason naming the port to use, and nothing is
// dialled.
func TestCoreHTTPOrTLSOnTheBinaryPortIsNamed(t *testing.T) {
	for _, tc := range []struct {
		name, first, want string
	}{
		{"http", "GET /admin/v2/tenants HTTP/1.1\r\nHost: x\r\n\r\n", "web port"},
		{"tls", "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", "TLS port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newCore(t, nil)

			l.feed(l.client, []byte(tc.first))

			if !errors.Is(l.s.reason, ErrWrongProtocol) || !strings.Contains(l.s.reason.Error(), tc.want) || !l.client.gone || l.targets != nil {
				t.Fatalf("reason %v, closed %v, dialled %v", l.s.reason, l.client.gone, l.targets)
			}
		})
	}
}
