package proxy

import (
	"crypto/tls"
	"net"
	"testing"

	"github.com/rebatchproxy/rebatchproxy/internal/testcert"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
	"google.golang.org/protobuf/proto"
)

// newFakeTLSBroker is a fakeBroker whose connections are TLS with the test server certificate,
// listening on host (127.0.0.1 is in the certificate; 127.0.0.2 is not).
func newFakeTLSBroker(t *testing.T, files testcert.Files, host string) *fakeBroker {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(files.ServerCert, files.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", host+":0")
	if err != nil {
		t.Fatalf("cannot listen on %s (a loopback address on Linux): %v", host, err)
	}
	tln := tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}})
	fb := &fakeBroker{ln: tln, conns: make(chan net.Conn, 16)}
	go func() {
		for {
			c, err := tln.Accept()
			if err != nil {
				return
			}
			go func() { _ = c.(*tls.Conn).Handshake() }() // as a broker does, before any frame
			fb.conns <- c
		}
	}()
	t.Cleanup(func() { tln.Close() })
	return fb
}

func startBrokerTLSProxy(t *testing.T, fb *fakeBroker, files testcert.Files) (*Server, string, *logBuffer) {
	t.Helper()
	return startProxy(t, []string{fb.addr()}, func(c *Config) {
		c.BrokerTLS, c.BrokerTLSTrustCertsFile = true, files.CA
	})
}

// Given a proxy speaking TLS to a (fake) broker whose lookup answers name its TLS URL,
// when a plaintext client connects, looks a topic up, and connects again naming the answer's
// broker URL,
// then both broker connections are TLS (the fake broker only speaks TLS), and the answer names
// the broker's TLS address in brokerServiceUrl (pulsar://) and brokerServiceUrlTls alike.
func TestBrokerTLSDialsTheBrokersTLSAddress(t *testing.T) {
	files, err := testcert.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	fb := newFakeTLSBroker(t, files, "127.0.0.1")
	_, addr, _ := startBrokerTLSProxy(t, fb, files)
	client, broker := handshake(t, addr, fb, "")
	send(t, client, frame(t, lookupRequest(5)))
	expect(t, broker, pulsarpb.BaseCommand_LOOKUP)
	answer := lookupResponse(5, "pulsar://127.0.0.1:1")
	answer.LookupTopicResponse.BrokerServiceUrlTls = proto.String("pulsar+ssl://" + fb.addr())

	send(t, broker, frame(t, answer))

	cmd, _ := expect(t, client, pulsarpb.BaseCommand_LOOKUP_RESPONSE)
	r := cmd.GetLookupTopicResponse()
	if r.GetBrokerServiceUrl() != "pulsar://"+fb.addr() || r.GetBrokerServiceUrlTls() != "pulsar+ssl://"+fb.addr() {
		t.Fatalf("answer %v", r)
	}
	data := dial(t, addr)
	send(t, data, frame(t, connectCmd(r.GetBrokerServiceUrl())))
	expect(t, fb.accept(t), pulsarpb.BaseCommand_CONNECT)
}

// Given a proxy speaking TLS to a broker whose certificate does not name the address dialled
// (127.0.0.2),
// when a client connects,
// then the client gets ERROR(ServiceNotReady) and the log names the TLS failure.
func TestBrokerTLSHostnameIsVerified(t *testing.T) {
	files, err := testcert.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	fb := newFakeTLSBroker(t, files, "127.0.0.2")
	_, addr, logs := startBrokerTLSProxy(t, fb, files)
	client := dial(t, addr)

	send(t, client, frame(t, connectCmd("")))

	cmd, _ := expect(t, client, pulsarpb.BaseCommand_ERROR)
	if cmd.GetError().GetError() != pulsarpb.ServerError_ServiceNotReady {
		t.Errorf("got %v", cmd.GetError())
	}
	logs.waitFor(t, "TLS with broker")

}
