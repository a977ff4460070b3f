package proxy_test

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

func rawFrame(t *testing.T, cmd *pulsarpb.BaseCommand) []byte {
	t.Helper()
	b, err := wire.AppendCommandFrame(nil, cmd)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func rawConnect(t *testing.T, proxyTo, token string) []byte {
	c := &pulsarpb.CommandConnect{ClientVersion: proto.String("e2e-raw"), ProtocolVersion: proto.Int32(20)}
	if proxyTo != "" {
		c.ProxyToBrokerUrl = proto.String(proxyTo)
	}
	if token != "" {
		c.AuthMethodName, c.AuthData = proto.String("token"), []byte(token)
	}
	return rawFrame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_CONNECT.Enum(), Connect: c})
}

// readCommand reads one frame from c and decodes it.
func readCommand(t *testing.T, c net.Conn) *pulsarpb.BaseCommand {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var hdr [4]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		t.Fatalf("reading a frame: %v", err)
	}
	b := make([]byte, 4+binary.BigEndian.Uint32(hdr[:]))
	copy(b, hdr[:])
	if _, err := io.ReadFull(c, b[4:]); err != nil {
		t.Fatal(err)
	}
	f, _, err := wire.ReadFrame(b, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	var cmd pulsarpb.BaseCommand
	if err := wire.DecodeCommand(f, &cmd); err != nil {
		t.Fatal(err)
	}
	return &cmd
}

func waitClosed(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 4096)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatal("proxy kept the connection open")
		}
		return
	}
}

// Given a proxy in front of the real broker and a Go producer working through it,
// when raw connections send bad input (a non-broker target, garbage, a frame
// over the broker's limit, a frame whose command overruns it, a peer closing
// mid-frame, a SEND before CONNECT),
// then each of those connections is closed with a log line naming the reason
// (the refused target first gets the Java proxy's ServiceNotReady error), and
// the Go producer keeps sending.
func TestBadInputClosesOnlyThatConnection(t *testing.T) {
	b := harness.Default(t)
	url, logs := startProxy(t, b)
	proxyAddr := url[len("pulsar://"):]
	c := newClient(t, url, nil)
	p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: uniqueTopic("bad"), DisableBatching: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	oversize := binary.BigEndian.AppendUint32(nil, 5<<20+wire.FramePadding) // broker max 5 MiB
	oversize = append(oversize, 0, 0, 0, 4)
	send := wire.AppendSendFrame(nil, &wire.Send{ProducerID: 1, SequenceID: 1}, []byte{0x0a, 0x01, 'p'}, []byte("x"))

	cases := []struct {
		name        string
		connectFrst bool
		input       []byte
		halfClose   bool
		log         string
	}{
		{"garbage", true, []byte("\x00\x00\x00\x05garbage!!"), false, "corrupt frame"},
		{"frame over max size", true, oversize, false, "frame too large"},
		{"command overruns frame", true, []byte{0, 0, 0, 8, 0, 0, 0, 100, 8, 18, 0, 0}, false, "corrupt frame"},
		{"truncated frame then close", true, send[:len(send)-3], true, "connection closed mid-frame"},
		{"SEND before CONNECT", false, send, false, "SEND before CONNECT"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := net.Dial("tcp", proxyAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			if tc.connectFrst {
				_, _ = raw.Write(rawConnect(t, "", ""))
				if cmd := readCommand(t, raw); cmd.GetType() != pulsarpb.BaseCommand_CONNECTED {
					t.Fatalf("got %s", cmd.GetType())
				}
			}

			_, _ = raw.Write(tc.input)
			if tc.halfClose {
				time.Sleep(100 * time.Millisecond)
				_ = raw.(*net.TCPConn).CloseWrite()
			}

			waitClosed(t, raw)
			logs.WaitFor(t, tc.log)
			if _, err := p.Send(ctxT(t, 10*time.Second), &pulsar.ProducerMessage{Payload: []byte(tc.name)}); err != nil {
				t.Fatalf("the other client was disturbed: %v", err)
			}
		})
	}
	t.Run("proxy_to_broker_url names a non-broker", func(t *testing.T) {
		raw, err := net.Dial("tcp", proxyAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()

		_, _ = raw.Write(rawConnect(t, b.AdminURL[len("http://"):], "")) // the broker's HTTP port

		cmd := readCommand(t, raw)
		if cmd.GetType() != pulsarpb.BaseCommand_ERROR || cmd.GetError().GetError() != pulsarpb.ServerError_ServiceNotReady ||
			cmd.GetError().GetMessage() != "Target broker cannot be validated." {
			t.Fatalf("got %v", cmd)
		}
		waitClosed(t, raw)
		logs.WaitFor(t, "target broker cannot be validated")
		if _, err := p.Send(ctxT(t, 10*time.Second), &pulsar.ProducerMessage{Payload: []byte("after")}); err != nil {
			t.Fatalf("the other client was disturbed: %v", err)
		}
	})
}

// Given a private broker with token authentication and a proxy in front of it,
// when clients connect through the proxy with a good token and with a token
// signed by another key,
// then the good one produces and consumes, and the bad one gets exactly the
// ERROR the broker gives on a direct connection.
func TestTokenAuthThroughProxy(t *testing.T) {
	b, err := harness.StartBroker(harness.Options{TokenAuth: true})
	if err != nil {
		t.Fatalf("starting a token-auth broker: %v", err)
	}
	defer b.Stop()
	url, _ := startProxy(t, b)
	good, err := b.Token("alice")
	if err != nil {
		t.Fatal(err)
	}
	bad := harness.SignToken([]byte("not-the-broker-key-not-the-broker-key"), "alice")

	t.Run("good token", func(t *testing.T) {
		c := newClient(t, url, pulsar.NewAuthenticationToken(good))
		topic := uniqueTopic("auth")
		cons, err := c.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s"})
		if err != nil {
			t.Fatal(err)
		}
		defer cons.Close()
		p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()

		if _, err := p.Send(ctxT(t, 20*time.Second), &pulsar.ProducerMessage{Payload: []byte("hi")}); err != nil {
			t.Fatal(err)
		}

		if m := receiveN(t, 1, cons)[0]; string(m.Payload()) != "hi" {
			t.Fatalf("got %q", m.Payload())
		}
	})
	t.Run("bad token", func(t *testing.T) {
		refusal := func(addr string) *pulsarpb.CommandError {
			raw, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			_, _ = raw.Write(rawConnect(t, "", bad))
			cmd := readCommand(t, raw)
			if cmd.GetType() != pulsarpb.BaseCommand_ERROR {
				t.Fatalf("%s answered a bad token with %s", addr, cmd.GetType())
			}
			waitClosed(t, raw)
			return cmd.GetError()
		}
		direct := refusal(b.ServiceURL[len("pulsar://"):])

		proxied := refusal(url[len("pulsar://"):])

		if proxied.GetError() != direct.GetError() || proxied.GetMessage() != direct.GetMessage() {
			t.Fatalf("through the proxy: %v; direct: %v", proxied, direct)
		}
		if direct.GetError() != pulsarpb.ServerError_AuthenticationError {
			t.Fatalf("broker answered %v", direct)
		}
		// And the real client is refused too.
		c, err := pulsar.NewClient(pulsar.ClientOptions{URL: url, OperationTimeout: 3 * time.Second, Logger: quietLogger(),
			Authentication: pulsar.NewAuthenticationToken(bad)})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.CreateProducer(pulsar.ProducerOptions{Topic: uniqueTopic("auth"), SendTimeout: 3 * time.Second}); err == nil {
			t.Fatal("producer created with a bad token")
		}
	})
}
