package proxy

import (
	"bytes"
	"encoding/binary"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// Given a proxy in front of a broker,
// when a client sends CONNECT naming that broker in proxy_to_broker_url,
// then the broker receives the client's CONNECT (auth data intact) without
// proxy_to_broker_url, and the client receives the broker's CONNECTED bytes unchanged.
func TestConnectForwardedWithoutProxyURLAndConnectedRelayedVerbatim(t *testing.T) {
	fb := newFakeBroker(t)
	_, addr, _ := startProxy(t, []string{fb.addr()}, nil)
	client := dial(t, addr)

	send(t, client, frame(t, connectCmd(fb.addr())))

	broker := fb.accept(t)
	got, _ := expect(t, broker, pulsarpb.BaseCommand_CONNECT)
	if got.GetConnect().ProxyToBrokerUrl != nil {
		t.Errorf("proxy_to_broker_url reached the broker: %q", got.GetConnect().GetProxyToBrokerUrl())
	}
	if string(got.GetConnect().GetAuthData()) != "secret-token" || got.GetConnect().GetAuthMethodName() != "token" {
		t.Errorf("auth not passed through: %v", got.GetConnect())
	}
	connected := frame(t, connectedCmd(123456))
	send(t, broker, connected)
	if _, b := expect(t, client, pulsarpb.BaseCommand_CONNECTED); !bytes.Equal(b, connected) {
		t.Errorf("CONNECTED changed: % x, want % x", b, connected)
	}
}

// Given an established connection pair,
// when client and broker each send a mix of frames (payload frames included),
// then each side receives exactly the other's bytes, in order.
func TestFramesForwardedByteForByteBothWays(t *testing.T) {
	fb := newFakeBroker(t)
	_, addr, _ := startProxy(t, []string{fb.addr()}, nil)
	client, broker := handshake(t, addr, fb, "")
	var up, down []byte
	for i := 0; i < 50; i++ {
		up = wire.AppendSendFrame(up, &wire.Send{ProducerID: 1, SequenceID: uint64(i)}, []byte{0x0a, 0x01, 'p'}, bytes.Repeat([]byte{byte(i)}, 100+i))
		up = append(up, frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PING.Enum(), Ping: &pulsarpb.CommandPing{}})...)
		down = append(down, frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_SEND_RECEIPT.Enum(), SendReceipt: &pulsarpb.CommandSendReceipt{ProducerId: proto.Uint64(1), SequenceId: proto.Uint64(uint64(i))}})...)
		down = append(down, frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PONG.Enum(), Pong: &pulsarpb.CommandPong{}})...)
	}

	go func() { _, _ = client.Write(up); _, _ = broker.Write(down) }()

	readN := func(c net.Conn, n int) []byte {
		b := make([]byte, n)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := ioReadFull(c, b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	if got := readN(broker, len(up)); !bytes.Equal(got, up) {
		t.Error("broker did not receive the client's bytes unchanged")
	}
	if got := readN(client, len(down)); !bytes.Equal(got, down) {
		t.Error("client did not receive the broker's bytes unchanged")
	}
}

// Given a proxy that knows only its configured broker,
// when a client's CONNECT names another address in proxy_to_broker_url,
// then the client gets ERROR(ServiceNotReady, "Target broker cannot be validated."),
// the connection is closed, the reason is logged, and the proxy dials nothing.
func TestUnknownTargetRefused(t *testing.T) {
	fb := newFakeBroker(t)
	_, addr, logs := startProxy(t, []string{fb.addr()}, nil)
	client := dial(t, addr)

	send(t, client, frame(t, connectCmd("10.255.255.1:6650")))

	cmd, _ := expect(t, client, pulsarpb.BaseCommand_ERROR)
	if cmd.GetError().GetError() != pulsarpb.ServerError_ServiceNotReady || cmd.GetError().GetMessage() != "Target broker cannot be validated." {
		t.Errorf("got %v", cmd.GetError())
	}
	expectClosed(t, client)
	logs.waitFor(t, "target broker cannot be validated")
	select {
	case <-fb.conns:
		t.Error("proxy connected to the broker for a refused target")
	default:
	}
}

// Given a lookup connection,
// when the broker answers a LOOKUP with Connect to a broker URL the proxy did not know,
// then the client gets the answer with proxy_through_service_url=true and the rest unchanged,
// and a later data connection naming that broker is accepted.
func TestLookupAnswerRewrittenAndBrokerLearned(t *testing.T) {
	fb, other := newFakeBroker(t), newFakeBroker(t)
	_, addr, _ := startProxy(t, []string{fb.addr()}, nil)
	client, broker := handshake(t, addr, fb, "")
	send(t, client, frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_LOOKUP.Enum(), LookupTopic: &pulsarpb.CommandLookupTopic{Topic: proto.String("persistent://t/n/x"), RequestId: proto.Uint64(7)}}))
	expect(t, broker, pulsarpb.BaseCommand_LOOKUP)

	send(t, broker, frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_LOOKUP_RESPONSE.Enum(), LookupTopicResponse: &pulsarpb.CommandLookupTopicResponse{
		BrokerServiceUrl: proto.String("pulsar://" + other.addr()), Response: pulsarpb.CommandLookupTopicResponse_Connect.Enum(),
		RequestId: proto.Uint64(7), Authoritative: proto.Bool(true)}}))

	cmd, _ := expect(t, client, pulsarpb.BaseCommand_LOOKUP_RESPONSE)
	r := cmd.GetLookupTopicResponse()
	if !r.GetProxyThroughServiceUrl() || r.GetBrokerServiceUrl() != "pulsar://"+other.addr() || r.GetRequestId() != 7 || !r.GetAuthoritative() {
		t.Errorf("rewritten answer: %v", r)
	}
	data := dial(t, addr)
	send(t, data, frame(t, connectCmd(other.addr())))
	expect(t, other.accept(t), pulsarpb.BaseCommand_CONNECT)
}

// Given an established pair and a broker the proxy has never seen,
// when the broker closes a producer or a consumer naming that broker in
// assigned_broker_service_url (the extensible load manager moved the topic),
// then the client gets the frame unchanged, and a data connection naming the
// assigned broker is accepted: clients reconnect there through the proxy.
func TestAssignedBrokerOfCloseLearned(t *testing.T) {
	for _, typ := range []pulsarpb.BaseCommand_Type{pulsarpb.BaseCommand_CLOSE_PRODUCER, pulsarpb.BaseCommand_CLOSE_CONSUMER} {
		t.Run(typ.String(), func(t *testing.T) {
			fb, other := newFakeBroker(t), newFakeBroker(t)
			_, addr, _ := startProxy(t, []string{fb.addr()}, nil)
			client, broker := handshake(t, addr, fb, "")
			url := proto.String("pulsar://" + other.addr())
			cmd := &pulsarpb.BaseCommand{Type: typ.Enum()}
			if typ == pulsarpb.BaseCommand_CLOSE_PRODUCER {
				cmd.CloseProducer = &pulsarpb.CommandCloseProducer{ProducerId: proto.Uint64(1), RequestId: proto.Uint64(9), AssignedBrokerServiceUrl: url}
			} else {
				cmd.CloseConsumer = &pulsarpb.CommandCloseConsumer{ConsumerId: proto.Uint64(1), RequestId: proto.Uint64(9), AssignedBrokerServiceUrl: url}
			}
			b := frame(t, cmd)

			send(t, broker, b)

			if _, got := expect(t, client, typ); !bytes.Equal(got, b) {
				t.Fatal("the close frame reached the client changed")
			}
			data := dial(t, addr)
			send(t, data, frame(t, connectCmd(other.addr())))
			expect(t, other.accept(t), pulsarpb.BaseCommand_CONNECT)
		})
	}
}

// Given a proxy,
// when a client's first frame is a SEND instead of CONNECT,
// then the connection is closed with an out-of-order log line, and another client still connects.
func TestCommandBeforeConnectCloses(t *testing.T) {
	fb := newFakeBroker(t)
	_, addr, logs := startProxy(t, []string{fb.addr()}, nil)
	bad := dial(t, addr)

	send(t, bad, wire.AppendSendFrame(nil, &wire.Send{ProducerID: 1, SequenceID: 1}, []byte{0x0a, 0x01, 'p'}, []byte("x")))

	expectClosed(t, bad)
	logs.waitFor(t, "SEND before CONNECT")
	handshake(t, addr, fb, "")
}

// Given established connection pairs,
// when the client sends a bad byte stream,
// then that pair is closed with the reason logged, and the broker side is closed too.
func TestBadInputClosesPair(t *testing.T) {
	oversize := binary.BigEndian.AppendUint32(nil, 1<<20+wire.FramePadding) // limit is 1 MiB from CONNECTED
	oversize = append(oversize, 0, 0, 0, 4)
	truncatedCmd := []byte{0, 0, 0, 8, 0, 0, 0, 100, 8, 18, 0, 0} // commandSize beyond the frame
	cases := []struct {
		name  string
		input []byte
		log   string
	}{
		{"garbage", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), "frame too large"},
		{"frame over max size", oversize, "frame too large"},
		{"command size beyond frame", truncatedCmd, "corrupt frame"},
		{"second CONNECT", frame(t, connectCmd("")), "CONNECT from client on an established connection"},
		{"broker-only command from client", frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_SUCCESS.Enum(), Success: &pulsarpb.CommandSuccess{RequestId: proto.Uint64(1)}}), "SUCCESS from client"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fb := newFakeBroker(t)
			_, addr, logs := startProxy(t, []string{fb.addr()}, nil)
			client, broker := handshake(t, addr, fb, "")

			send(t, client, tc.input)

			expectClosed(t, client)
			expectClosed(t, broker)
			logs.waitFor(t, tc.log)
		})
	}
}

// Given a client that sent half a frame,
// when it closes its connection,
// then the proxy logs a truncated frame and closes the broker side.
func TestPeerClosingMidFrameLogged(t *testing.T) {
	fb := newFakeBroker(t)
	_, addr, logs := startProxy(t, []string{fb.addr()}, nil)
	client, broker := handshake(t, addr, fb, "")
	ping := frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PING.Enum(), Ping: &pulsarpb.CommandPing{}})
	send(t, client, ping[:len(ping)-1]) // TCP delivers these bytes before the close below

	client.Close()

	expectClosed(t, broker)
	logs.waitFor(t, "incomplete frame")
}

// Given an established pair,
// when the broker closes its connection,
// then the client's connection is closed.
func TestBrokerCloseClosesClient(t *testing.T) {
	fb := newFakeBroker(t)
	_, addr, _ := startProxy(t, []string{fb.addr()}, nil)
	client, broker := handshake(t, addr, fb, "")

	broker.Close()

	expectClosed(t, client)
}

// Given a broker that refuses a CONNECT with an ERROR (bad credentials),
// when the client connects,
// then the client receives the broker's own ERROR bytes and is disconnected.
func TestBrokerErrorOnConnectRelayed(t *testing.T) {
	fb := newFakeBroker(t)
	_, addr, _ := startProxy(t, []string{fb.addr()}, nil)
	client := dial(t, addr)
	send(t, client, frame(t, connectCmd("")))
	broker := fb.accept(t)
	expect(t, broker, pulsarpb.BaseCommand_CONNECT)
	refusal := frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_ERROR.Enum(), Error: &pulsarpb.CommandError{
		RequestId: proto.Uint64(0), Error: pulsarpb.ServerError_AuthenticationError.Enum(), Message: proto.String("Failed to authentication token: bad")}})

	send(t, broker, refusal)

	if _, b := expect(t, client, pulsarpb.BaseCommand_ERROR); !bytes.Equal(b, refusal) {
		t.Errorf("ERROR changed in transit")
	}
	expectClosed(t, client)
}

// Given a broker that never answers CONNECT,
// when the handshake timeout passes,
// then the client is disconnected and the timeout logged.
func TestHandshakeTimeout(t *testing.T) {
	fb := newFakeBroker(t)
	_, addr, logs := startProxy(t, []string{fb.addr()}, func(c *Config) { c.HandshakeTimeout = 300 * time.Millisecond })
	client := dial(t, addr)

	send(t, client, frame(t, connectCmd("")))

	fb.accept(t)
	expectClosed(t, client)
	logs.waitFor(t, "handshake timeout")
}

// Given a proxy allowing one lookup in flight and a lookup the broker has not answered,
// when the client sends a second LOOKUP,
// then the proxy answers it itself with TooManyRequests for that request id.
func TestLookupConcurrencyBound(t *testing.T) {
	fb := newFakeBroker(t)
	_, addr, _ := startProxy(t, []string{fb.addr()}, func(c *Config) { c.MaxConcurrentLookups = 1 })
	client, broker := handshake(t, addr, fb, "")
	lookup := func(id uint64) []byte {
		return frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_LOOKUP.Enum(), LookupTopic: &pulsarpb.CommandLookupTopic{Topic: proto.String("persistent://t/n/x"), RequestId: proto.Uint64(id)}})
	}
	send(t, client, lookup(1))
	expect(t, broker, pulsarpb.BaseCommand_LOOKUP)

	send(t, client, lookup(2))

	cmd, _ := expect(t, client, pulsarpb.BaseCommand_LOOKUP_RESPONSE)
	r := cmd.GetLookupTopicResponse()
	if r.GetRequestId() != 2 || r.GetResponse() != pulsarpb.CommandLookupTopicResponse_Failed || r.GetError() != pulsarpb.ServerError_TooManyRequests {
		t.Errorf("got %v", r)
	}
}

// Given a proxy allowing 2 lookups in flight per connection and 10 in all, and a client whose
// 2 lookups the broker has not answered,
// when that client sends 3 more and a second client sends one,
// then the first client's 3 are answered TooManyRequests by the proxy, the second client's
// lookup reaches the broker, and the refusals take one log line.
func TestLookupBoundPerConnection(t *testing.T) {
	fb := newFakeBroker(t)
	_, addr, logs := startProxy(t, []string{fb.addr()}, func(c *Config) { c.MaxConcurrentLookups, c.MaxConnectionLookups = 10, 2 })
	flooder, floodBroker := handshake(t, addr, fb, "")
	other, otherBroker := handshake(t, addr, fb, "")
	for id := uint64(1); id <= 2; id++ {
		send(t, flooder, frame(t, lookupCmd(id)))
		expect(t, floodBroker, pulsarpb.BaseCommand_LOOKUP)
	}

	for id := uint64(3); id <= 5; id++ {
		send(t, flooder, frame(t, lookupCmd(id)))
	}
	send(t, other, frame(t, lookupCmd(7)))

	for id := uint64(3); id <= 5; id++ {
		cmd, _ := expect(t, flooder, pulsarpb.BaseCommand_LOOKUP_RESPONSE)
		if r := cmd.GetLookupTopicResponse(); r.GetRequestId() != id || r.GetError() != pulsarpb.ServerError_TooManyRequests {
			t.Fatalf("flooder got %v, want TooManyRequests for %d", r, id)
		}
	}
	if cmd, _ := expect(t, otherBroker, pulsarpb.BaseCommand_LOOKUP); cmd.GetLookupTopic().GetRequestId() != 7 {
		t.Fatalf("broker got %v from the second client", cmd)
	}
	if n := strings.Count(logs.String(), "lookup refused"); n != 1 {
		t.Fatalf("%d log lines for 3 refusals, want 1:\n%s", n, logs.String())
	}
}
