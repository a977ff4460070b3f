package faultrelay

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// ---------------------------------------------------------------------------------------------
// a tiny fake server: CONNECT -> CONNECTED, LOOKUP -> LOOKUP_RESPONSE, SEND -> SEND_RECEIPT

type lookupAnswer struct {
	url          string // "" means the server's own pulsar:// URL
	redirect     bool
	proxyThrough bool
}

type received struct {
	conn    int
	typ     pulsarpb.BaseCommand_Type
	chunkID int32 // -1: not a chunk
	raw     []byte
}

type fakeServer struct {
	t      *testing.T
	ln     net.Listener
	lookup lookupAnswer
	silent bool // never answer SEND

	mu       sync.Mutex
	got      []received
	answered int
	conns    int
	eofs     int // connections the peer closed
	wg       sync.WaitGroup
}

func startFakeServer(t *testing.T, silent bool, lookup lookupAnswer) *fakeServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &fakeServer{t: t, ln: ln, silent: silent, lookup: lookup}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns++
			id := s.conns
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.serve(id, c)
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); s.wg.Wait() })
	return s
}

func (s *fakeServer) addr() string { return s.ln.Addr().String() }

func (s *fakeServer) serve(id int, c net.Conn) {
	defer func() { _ = c.Close() }()
	br := bufio.NewReader(c)
	for {
		buf, f, err := readFrame(br, 1<<20)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err) {
				s.mu.Lock()
				s.eofs++
				s.mu.Unlock()
			}
			return
		}
		r := received{conn: id, typ: f.Type(), chunkID: -1, raw: buf}
		var reply []byte
		switch f.Type() {
		case pulsarpb.BaseCommand_PING:
			reply = wire.AppendPongFrame(nil)
		case pulsarpb.BaseCommand_CONNECT:
			reply = commandFrame(s.t, &pulsarpb.BaseCommand{
				Type:      pulsarpb.BaseCommand_CONNECTED.Enum(),
				Connected: &pulsarpb.CommandConnected{ServerVersion: proto.String("fake"), ProtocolVersion: proto.Int32(21)},
			})
		case pulsarpb.BaseCommand_LOOKUP:
			var cmd pulsarpb.BaseCommand
			if err := wire.DecodeCommand(f, &cmd); err != nil {
				s.t.Error(err)
				return
			}
			u := s.lookup.url
			if u == "" {
				u = "pulsar://" + s.addr()
			}
			typ := pulsarpb.CommandLookupTopicResponse_Connect
			if s.lookup.redirect {
				typ = pulsarpb.CommandLookupTopicResponse_Redirect
			}
			reply = commandFrame(s.t, &pulsarpb.BaseCommand{
				Type: pulsarpb.BaseCommand_LOOKUP_RESPONSE.Enum(),
				LookupTopicResponse: &pulsarpb.CommandLookupTopicResponse{
					BrokerServiceUrl: proto.String(u), Response: typ.Enum(),
					RequestId: proto.Uint64(cmd.GetLookupTopic().GetRequestId()), Authoritative: proto.Bool(true),
					ProxyThroughServiceUrl: proto.Bool(s.lookup.proxyThrough),
				},
			})
		case pulsarpb.BaseCommand_SEND:
			send, err := wire.ParseSend(f)
			if err != nil {
				s.t.Error(err)
				return
			}
			var md pulsarpb.MessageMetadata
			if err := wire.DecodeMetadata(f.Metadata(), &md); err == nil && md.ChunkId != nil {
				r.chunkID = md.GetChunkId()
			}
			if !s.silent {
				s.mu.Lock()
				s.answered++
				entry := uint64(s.answered)
				s.mu.Unlock()
				reply = wire.AppendSendReceiptFrame(nil, &wire.SendReceipt{ProducerID: send.ProducerID,
					SequenceID: send.SequenceID, HasMessageID: true, LedgerID: 7, EntryID: entry})
			}
		}
		s.mu.Lock()
		s.got = append(s.got, r)
		s.mu.Unlock()
		if reply != nil {
			if _, err := c.Write(reply); err != nil {
				return
			}
		}
	}
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op)
}

// sends returns the chunk ids of the SEND frames the server got (-1 for a plain send).
func (s *fakeServer) sends() []int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int32
	for _, r := range s.got {
		if r.typ == pulsarpb.BaseCommand_SEND {
			out = append(out, r.chunkID)
		}
	}
	return out
}

func (s *fakeServer) raw() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []byte
	for _, r := range s.got {
		out = append(out, r.raw...)
	}
	return out
}

func (s *fakeServer) waitEOFs(t *testing.T, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		s.mu.Lock()
		e := s.eofs
		s.mu.Unlock()
		if e >= n {
			return
		}
	}
	t.Fatalf("the server saw fewer than %d closed connections", n)
}

// ---------------------------------------------------------------------------------------------
// a raw client

func commandFrame(t *testing.T, cmd *pulsarpb.BaseCommand) []byte {
	t.Helper()
	b, err := wire.AppendCommandFrame(nil, cmd)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func connectFrame(t *testing.T) []byte {
	return commandFrame(t, &pulsarpb.BaseCommand{
		Type:    pulsarpb.BaseCommand_CONNECT.Enum(),
		Connect: &pulsarpb.CommandConnect{ClientVersion: proto.String("test"), ProtocolVersion: proto.Int32(21)},
	})
}

func lookupFrame(t *testing.T) []byte {
	return commandFrame(t, &pulsarpb.BaseCommand{
		Type:        pulsarpb.BaseCommand_LOOKUP.Enum(),
		LookupTopic: &pulsarpb.CommandLookupTopic{Topic: proto.String("persistent://public/default/t"), RequestId: proto.Uint64(1)},
	})
}

// sendFrame is a SEND of sequence id seq; chunk >= 0 makes it chunk `chunk` of 5.
func sendFrame(t *testing.T, seq uint64, chunk int32) []byte {
	t.Helper()
	md := &pulsarpb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(seq), PublishTime: proto.Uint64(1)}
	s := &wire.Send{ProducerID: 1, SequenceID: seq}
	if chunk >= 0 {
		md.ChunkId = proto.Int32(chunk)
		md.NumChunksFromMsg = proto.Int32(5)
		md.TotalChunkMsgSize = proto.Int32(500)
		md.Uuid = proto.String("p-0")
		s.IsChunk = true
	}
	b, err := wire.AppendSendFrameMetadata(nil, s, md, bytes.Repeat([]byte{'x'}, 100))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type rawClient struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dial(t *testing.T, r *Relay) *rawClient {
	t.Helper()
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &rawClient{t: t, c: c, br: bufio.NewReader(c)}
}

func (c *rawClient) write(frames ...[]byte) {
	c.t.Helper()
	for _, f := range frames {
		if _, err := c.c.Write(f); err != nil {
			c.t.Fatal(err)
		}
	}
}

// read returns the next frame; it fails the test on a timeout or a closed connection.
func (c *rawClient) read() ([]byte, wire.Frame) {
	c.t.Helper()
	_ = c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf, f, err := readFrame(c.br, 1<<20)
	if err != nil {
		c.t.Fatalf("client read: %v", err)
	}
	return buf, f
}

// drainUntilClosed reads until the relay closes the connection and returns the frame types seen.
func (c *rawClient) drainUntilClosed() []pulsarpb.BaseCommand_Type {
	c.t.Helper()
	_ = c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var types []pulsarpb.BaseCommand_Type
	for {
		_, f, err := readFrame(c.br, 1<<20)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				c.t.Fatalf("the relay did not close the client connection (got %v)", types)
			}
			return types
		}
		types = append(types, f.Type())
	}
}

func startRelay(t *testing.T, cfg Config) *Relay {
	t.Helper()
	cfg.Logf = t.Logf
	r, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func waitFired(t *testing.T, r *Relay) {
	t.Helper()
	select {
	case <-r.Fired():
	case <-time.After(10 * time.Second):
		t.Fatal("the rule did not fire")
	}
}

// ---------------------------------------------------------------------------------------------
// tests

func TestWithoutRule_FramesAreRelayedByteForByteBothWays(t *testing.T) {
	// Given a relay without a rule in front of a server
	srv := startFakeServer(t, false, lookupAnswer{})
	r := startRelay(t, Config{Upstream: srv.addr()})
	c := dial(t, r)
	sent := [][]byte{connectFrame(t), sendFrame(t, 0, -1), sendFrame(t, 1, 0), sendFrame(t, 1, 1)}

	// When a client sends CONNECT, a plain send and two chunks
	c.write(sent...)

	// Then the server gets exactly those bytes and the client gets the server's four answers
	var want []byte
	for _, f := range sent {
		want = append(want, f...)
	}
	var types []pulsarpb.BaseCommand_Type
	for range 4 {
		_, f := c.read()
		types = append(types, f.Type())
	}
	if !bytes.Equal(srv.raw(), want) {
		t.Fatalf("server got %d bytes, want the client's %d bytes unchanged", len(srv.raw()), len(want))
	}
	wantTypes := []pulsarpb.BaseCommand_Type{pulsarpb.BaseCommand_CONNECTED, pulsarpb.BaseCommand_SEND_RECEIPT,
		pulsarpb.BaseCommand_SEND_RECEIPT, pulsarpb.BaseCommand_SEND_RECEIPT}
	for i := range wantTypes {
		if types[i] != wantTypes[i] {
			t.Fatalf("client got %v, want %v", types, wantTypes)
		}
	}
	if len(r.Cuts()) != 0 {
		t.Fatalf("cuts without a rule: %v", r.Cuts())
	}
}

func TestLookupRewrite_OnlyConnectAnswersNamingTheUpstreamPointAtTheRelay(t *testing.T) {
	cases := []struct {
		name    string
		answer  lookupAnswer
		rewrite bool
		stat    func(Stats) int
	}{
		{"connect to the upstream", lookupAnswer{}, true, func(s Stats) int { return s.LookupsRewritten }},
		{"proxy_through_service_url", lookupAnswer{proxyThrough: true}, false, func(s Stats) int { return s.LookupsProxied }},
		{"another broker", lookupAnswer{url: "pulsar://10.1.2.3:6650"}, false, func(s Stats) int { return s.LookupsNotRewritten }},
		{"redirect", lookupAnswer{redirect: true}, false, func(s Stats) int { return s.LookupsNotRewritten }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Given a relay that rewrites lookups, in front of a server answering as tc.answer
			srv := startFakeServer(t, false, tc.answer)
			r := startRelay(t, Config{Upstream: srv.addr(), RewriteLookups: true})
			c := dial(t, r)
			c.write(connectFrame(t))
			c.read()

			// When the client looks a topic up
			c.write(lookupFrame(t))

			// Then the answer names the relay only for a Connect answer naming the upstream
			_, f := c.read()
			var cmd pulsarpb.BaseCommand
			if err := wire.DecodeCommand(f, &cmd); err != nil {
				t.Fatal(err)
			}
			lr := cmd.GetLookupTopicResponse()
			orig := tc.answer.url
			if orig == "" {
				orig = "pulsar://" + srv.addr()
			}
			want := orig
			if tc.rewrite {
				want = r.URL()
			}
			if lr.GetBrokerServiceUrl() != want {
				t.Fatalf("broker_service_url = %q, want %q", lr.GetBrokerServiceUrl(), want)
			}
			if lr.GetRequestId() != 1 || lr.GetProxyThroughServiceUrl() != tc.answer.proxyThrough || !lr.GetAuthoritative() {
				t.Fatalf("other fields changed: %v", lr)
			}
			if got := tc.stat(r.Stats()); got != 1 {
				t.Fatalf("stats %+v: counter for this case is %d, want 1", r.Stats(), got)
			}
		})
	}
}

func TestCut_ServerStoresTheFirstNChunksAndTheClientGetsNoneOfTheirReceipts(t *testing.T) {
	// Given a relay cutting after 3 chunk sends, and a client whose plain send was answered
	srv := startFakeServer(t, false, lookupAnswer{})
	r := startRelay(t, Config{Upstream: srv.addr(), Rule: &Rule{After: 3}})
	c := dial(t, r)
	c.write(connectFrame(t), sendFrame(t, 0, -1))
	c.read()
	if _, f := c.read(); f.Type() != pulsarpb.BaseCommand_SEND_RECEIPT {
		t.Fatalf("plain send answered with %v", f.Type())
	}

	// When the client sends the 5 chunks of one message in one write
	var chunks []byte
	for i := range int32(5) {
		chunks = append(chunks, sendFrame(t, 1, i)...)
	}
	c.write(chunks)

	// Then the server got chunks 0..2 only, answered them, the client got nothing more, and both
	// sides were closed
	if got := c.drainUntilClosed(); len(got) != 0 {
		t.Fatalf("client got %v after the chunks, want nothing", got)
	}
	waitFired(t, r)
	srv.waitEOFs(t, 1)
	if got, want := srv.sends(), []int32{-1, 0, 1, 2}; !slices.Equal(got, want) {
		t.Fatalf("server got sends %v, want %v", got, want)
	}
	cuts := r.Cuts()
	want := Cut{Conn: 1, Matched: 3, SendsForwarded: 4, Answered: 4, Withheld: 3, Drained: true}
	if len(cuts) == 1 {
		cuts[0].DroppedFromClient = 0 // best effort: frames still unread at the close are not counted
	}
	if len(cuts) != 1 || cuts[0] != want {
		t.Fatalf("cuts = %+v, want [%+v]", cuts, want)
	}
}

func TestCut_HoldFromLetsEarlierReceiptsThrough(t *testing.T) {
	// Given a relay holding receipts from the 2nd chunk on and cutting after the 3rd
	srv := startFakeServer(t, false, lookupAnswer{})
	r := startRelay(t, Config{Upstream: srv.addr(), Rule: &Rule{After: 3, HoldFrom: 2}})
	c := dial(t, r)
	c.write(connectFrame(t), sendFrame(t, 1, 0))
	c.read()
	if _, f := c.read(); f.Type() != pulsarpb.BaseCommand_SEND_RECEIPT {
		t.Fatalf("chunk 0 answered with %v", f.Type())
	}

	// When the client sends chunk 1 and then a PING
	c.write(sendFrame(t, 1, 1), wire.AppendPingFrame(nil))

	// Then the server's PONG reaches the client but the receipt it sent before it does not, and the
	// third chunk still cuts the connection
	if _, f := c.read(); f.Type() != pulsarpb.BaseCommand_PONG {
		t.Fatalf("client got %v, want PONG (the receipt of chunk 1 withheld)", f.Type())
	}
	c.write(sendFrame(t, 1, 2))
	if got := c.drainUntilClosed(); len(got) != 0 {
		t.Fatalf("client got %v after chunk 2, want nothing", got)
	}
	waitFired(t, r)
	want := Cut{Conn: 1, Matched: 3, SendsForwarded: 3, Answered: 3, Withheld: 2, Drained: true}
	if cuts := r.Cuts(); len(cuts) != 1 || cuts[0] != want {
		t.Fatalf("cuts = %+v, want [%+v]", cuts, want)
	}
}

func TestCut_SilentServerIsCutAfterDrainAndReportedUndrained(t *testing.T) {
	// Given a server that never answers sends and a relay cutting after 1 chunk with a short drain
	srv := startFakeServer(t, true, lookupAnswer{})
	r := startRelay(t, Config{Upstream: srv.addr(), Rule: &Rule{After: 1, Drain: 200 * time.Millisecond}})
	c := dial(t, r)
	c.write(connectFrame(t))
	c.read()

	// When the client sends one chunk
	c.write(sendFrame(t, 1, 0))

	// Then the relay still closes, and says the server did not answer
	c.drainUntilClosed()
	waitFired(t, r)
	want := Cut{Conn: 1, Matched: 1, SendsForwarded: 1, Answered: 0, Drained: false}
	if cuts := r.Cuts(); len(cuts) != 1 || cuts[0] != want {
		t.Fatalf("cuts = %+v, want [%+v]", cuts, want)
	}
}

func TestCut_FiresOnOneConnectionAndTheReconnectIsRelayedUntouched(t *testing.T) {
	// Given a relay whose rule already fired on a first connection
	srv := startFakeServer(t, false, lookupAnswer{})
	r := startRelay(t, Config{Upstream: srv.addr(), Rule: &Rule{After: 1}})
	first := dial(t, r)
	first.write(connectFrame(t), sendFrame(t, 1, 0))
	first.drainUntilClosed()
	waitFired(t, r)

	// When the client reconnects and resends the chunks
	second := dial(t, r)
	second.write(connectFrame(t), sendFrame(t, 1, 0), sendFrame(t, 1, 1))

	// Then every send is answered on the new connection and the server stored chunk 0 twice
	for range 3 {
		second.read()
	}
	if got, want := srv.sends(), []int32{0, 0, 1}; !slices.Equal(got, want) {
		t.Fatalf("server got sends %v, want %v", got, want)
	}
	if n := len(r.Cuts()); n != 1 {
		t.Fatalf("%d cuts, want 1", n)
	}
}

func TestStart_RejectsRulesThatCannotFire(t *testing.T) {
	for _, rule := range []Rule{{After: 0}, {After: 2, HoldFrom: 3}, {After: 2, HoldFrom: -1}} {
		// Given / When a relay is started with the rule
		_, err := Start(Config{Upstream: "127.0.0.1:1", Rule: &rule})
		// Then it is refused
		if err == nil {
			t.Errorf("rule %+v accepted", rule)
		}
	}
}
