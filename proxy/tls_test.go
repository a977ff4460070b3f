package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rebatchproxy/rebatchproxy/internal/testcert"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// startTLSProxy runs a proxy with a TLS listener (certificates made now) in front of fb.
func startTLSProxy(t *testing.T, fb *fakeBroker, mod func(*Config)) (*Server, testcert.Files, *logBuffer) {
	t.Helper()
	files, err := testcert.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv, _, logs := startProxy(t, []string{fb.addr()}, func(c *Config) {
		c.TLSListen, c.TLSCertFile, c.TLSKeyFile = "127.0.0.1:0", files.ServerCert, files.ServerKey
		if mod != nil {
			mod(c)
		}
	})
	return srv, files, logs
}

func tlsClientConfig(t *testing.T, caFile string, certs ...tls.Certificate) *tls.Config {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &tls.Config{RootCAs: pool, ServerName: "localhost", Certificates: certs}
}

// tlsHandshake connects a TLS client through srv to fb: CONNECT forwarded, CONNECTED relayed.
func tlsHandshake(t *testing.T, srv *Server, files testcert.Files, fb *fakeBroker) (*tls.Conn, net.Conn) {
	t.Helper()
	c, err := tls.Dial("tcp", srv.TLSAddr(), tlsClientConfig(t, files.CA))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	send(t, c, frame(t, connectCmd("")))
	broker := fb.accept(t)
	expect(t, broker, pulsarpb.BaseCommand_CONNECT)
	send(t, broker, frame(t, connectedCmd(1<<20)))
	expect(t, c, pulsarpb.BaseCommand_CONNECTED)
	return c, broker
}

// Given a proxy with a TLS listener in front of a plaintext (fake) broker,
// when a client connects with TLS, sends CONNECT and a LOOKUP, and the broker answers,
// then the broker gets the CONNECT in plaintext, the client gets CONNECTED over TLS, and the lookup
// answer gives it a pulsar+ssl:// broker URL (brokerServiceUrlTls) that the proxy accepts back.
func TestTLSClientIsProxiedToAPlaintextBroker(t *testing.T) {
	fb := newFakeBroker(t)
	srv, files, _ := startTLSProxy(t, fb, nil)

	c, broker := tlsHandshake(t, srv, files, fb)
	send(t, c, frame(t, lookupRequest(3)))
	expect(t, broker, pulsarpb.BaseCommand_LOOKUP)
	send(t, broker, frame(t, lookupResponse(3, "pulsar://"+fb.addr())))
	cmd, _ := expect(t, c, pulsarpb.BaseCommand_LOOKUP_RESPONSE)

	r := cmd.GetLookupTopicResponse()
	if !r.GetProxyThroughServiceUrl() || r.GetBrokerServiceUrlTls() != "pulsar+ssl://"+fb.addr() {
		t.Fatalf("lookup answer %v", r)
	}
	c2, err := tls.Dial("tcp", srv.TLSAddr(), tlsClientConfig(t, files.CA))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	send(t, c2, frame(t, connectCmd(r.GetBrokerServiceUrlTls())))
	expect(t, fb.accept(t), pulsarpb.BaseCommand_CONNECT)
}

// Given a proxy with a TLS listener,
// when a client speaks plaintext Pulsar to it,
// then the connection is closed with a log line saying it was not TLS, and counted.
func TestPlaintextOnTheTLSPortIsRefused(t *testing.T) {
	fb := newFakeBroker(t)
	srv, _, logs := startTLSProxy(t, fb, nil)
	c, err := net.Dial("tcp", srv.TLSAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	send(t, c, frame(t, connectCmd("")))

	expectClosed(t, c)
	logs.waitFor(t, "not TLS")
	if n := srv.m.tlsHandshakeFailures.Load(); n != 1 {
		t.Errorf("%d handshake failures counted", n)
	}
}

// Given a proxy whose TLS listener requires client certificates from its CA,
// when one client presents a certificate that CA signed and another presents none,
// then the first is proxied and the second is refused in the handshake, with a log line.
func TestTLSClientCertificateRequired(t *testing.T) {
	fb := newFakeBroker(t)
	files, err := testcert.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv, _, logs := startProxy(t, []string{fb.addr()}, func(c *Config) {
		c.TLSListen, c.TLSCertFile, c.TLSKeyFile, c.TLSClientCAFile = "127.0.0.1:0", files.ServerCert, files.ServerKey, files.CA
	})
	cert, err := tls.LoadX509KeyPair(files.ClientCert, files.ClientKey)
	if err != nil {
		t.Fatal(err)
	}

	good, err := tls.Dial("tcp", srv.TLSAddr(), tlsClientConfig(t, files.CA, cert))
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	send(t, good, frame(t, connectCmd("")))
	expect(t, fb.accept(t), pulsarpb.BaseCommand_CONNECT)

	bad, err := tls.Dial("tcp", srv.TLSAddr(), tlsClientConfig(t, files.CA))
	if err == nil {
		defer bad.Close()
		_ = bad.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = bad.Read(make([]byte, 1)) // TLS 1.3: the refusal comes after the client's half
	}
	if err == nil {
		t.Fatal("a client without a certificate was let in")
	}
	logs.waitFor(t, "TLS handshake failed")
}

// Given a proxy (64 KiB soft, 256 KiB hard limit) with a TLS client whose broker stops reading,
// when the client sends 16 MiB of SENDs over TLS,
// then the client is slowed (its writes block) while the proxy holds less than the hard limit,
// and once the broker reads it gets every byte in order: the net.Conn transport's backpressure.
func TestSlowBrokerSlowsATLSClient(t *testing.T) {
	fb := newFakeBroker(t)
	srv, files, logs := startTLSProxy(t, fb, bpConfig)
	c, broker := tlsHandshake(t, srv, files, fb)

	stallThenDrain(t, srv, c, broker, sendFrames(500, 32<<10), 2*time.Second, 256<<10)

	if n := srv.m.parks[toBroker].Load(); n == 0 {
		t.Error("the TLS client was never parked")
	}
	if strings.Contains(logs.String(), "buffer limit") {
		t.Errorf("hard limit reached:\n%s", logs)
	}
}

// Given a proxy (64 KiB soft, 256 KiB hard limit) with a TLS client that stops reading,
// when the broker sends 32 MiB of MESSAGEs,
// then the broker is slowed while the proxy holds less than the hard limit (what the client's
// socket does not take waits in its side's spill, which backpressure counts), and once the
// client reads it gets every byte in order, decrypted.
func TestSlowTLSConsumerSlowsTheBroker(t *testing.T) {
	fb := newFakeBroker(t)
	srv, files, logs := startTLSProxy(t, fb, bpConfig)
	c, broker := tlsHandshake(t, srv, files, fb)

	stallThenDrain(t, srv, broker, c, messageFrames(t, 1000, 32<<10), 2*time.Second, 256<<10)

	if n := srv.m.parks[toClient].Load(); n == 0 {
		t.Error("the broker connection was never parked")
	}
	if strings.Contains(logs.String(), "buffer limit") {
		t.Errorf("hard limit reached:\n%s", logs)
	}
}

// Given a TLS client that stopped reading while the broker sent it more than its socket holds
// (the proxy's write towards it blocked, the broker parked),
// when the session is closed (as when the drain deadline of a shutdown passes),
// then the client's side is closed within the close flush timeout and the session ends,
// although the client never reads again: a blocked write does not keep a closed session alive.
func TestClosingASessionBoundsAWriteBlockedOnAStalledTLSClient(t *testing.T) {
	defer func(d time.Duration) { closeFlushTimeout = d }(closeFlushTimeout)
	closeFlushTimeout = 500 * time.Millisecond
	fb := newFakeBroker(t)
	srv, files, _ := startTLSProxy(t, fb, bpConfig)
	_, broker := tlsHandshake(t, srv, files, fb)
	data := messageFrames(t, 1000, 32<<10)
	go func() { _, _ = broker.Write(data) }()
	time.Sleep(time.Second) // the client's socket and the proxy's output towards it fill

	srv.sessions.Range(func(k, _ any) bool { k.(*session).closeAsync(ErrShutdown); return true })

	deadline := time.Now().Add(closeFlushTimeout + 3*time.Second)
	for srv.nsessions.Load() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d session(s) still open %s after the close; the blocked write was not bounded", srv.nsessions.Load(), closeFlushTimeout+3*time.Second)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// recordingConn keeps a copy of every byte read from the connection under it.
type recordingConn struct {
	net.Conn
	mu   sync.Mutex
	read []byte
}

func (r *recordingConn) Read(p []byte) (int, error) {
	n, err := r.Conn.Read(p)
	r.mu.Lock()
	r.read = append(r.read, p[:n]...)
	r.mu.Unlock()
	return n, err
}

// lastRecordType walks the TLS records in b and returns the content type of the last whole one.
func lastRecordType(t *testing.T, b []byte) byte {
	t.Helper()
	var last byte
	for len(b) >= 5 {
		n := 5 + int(binary.BigEndian.Uint16(b[3:5]))
		if n > len(b) {
			t.Fatalf("a TLS record cut short: %d of %d bytes", len(b), n)
		}
		last, b = b[0], b[n:]
	}
	if len(b) != 0 {
		t.Fatalf("%d bytes after the last TLS record", len(b))
	}
	return last
}

// Given a TLS 1.2 client proxied to a broker (in TLS 1.2 an alert's record type is in the clear),
// when the broker closes its connection,
// then the proxy ends the client's connection with a close_notify alert, the last record the
// client receives, and the client's Read reports a clean end (io.EOF): a truncation attack and an
// orderly close look different to the client, as with a broker's own TLS.
func TestTheProxyEndsATLSConnectionWithCloseNotify(t *testing.T) {
	fb := newFakeBroker(t)
	srv, files, _ := startTLSProxy(t, fb, nil)
	tcp, err := net.Dial("tcp", srv.TLSAddr())
	if err != nil {
		t.Fatal(err)
	}
	rec := &recordingConn{Conn: tcp}
	cfg := tlsClientConfig(t, files.CA)
	cfg.MaxVersion = tls.VersionTLS12
	c := tls.Client(rec, cfg)
	defer c.Close()
	send(t, c, frame(t, connectCmd("")))
	broker := fb.accept(t)
	expect(t, broker, pulsarpb.BaseCommand_CONNECT)
	send(t, broker, frame(t, connectedCmd(1<<20)))
	expect(t, c, pulsarpb.BaseCommand_CONNECTED)

	broker.Close()

	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("the client's read ended with %v, want io.EOF", err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if typ := lastRecordType(t, rec.read); typ != 21 {
		t.Errorf("the last record the client got has type %d, want 21 (alert: close_notify)", typ)
	}
}
