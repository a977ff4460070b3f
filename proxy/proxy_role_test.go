package proxy

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/internal/testcert"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// proxyRoleSetup is a proxy whose TLS listener requires client certificates from the test CA
// and which authenticates certificate clients to the (fake) broker with a token of its own.
type proxyRoleSetup struct {
	srv       *Server
	files     testcert.Files
	tokenFile string
	logs      *logBuffer
	fb        *fakeBroker
}

func startProxyRole(t *testing.T) proxyRoleSetup {
	t.Helper()
	fb := newFakeBroker(t)
	files, err := testcert.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "proxy.token")
	if err := os.WriteFile(tokenFile, []byte("proxy-token-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, _, logs := startProxy(t, []string{fb.addr()}, func(c *Config) {
		c.TLSListen, c.TLSCertFile, c.TLSKeyFile, c.TLSClientCAFile = "127.0.0.1:0", files.ServerCert, files.ServerKey, files.CA
		c.BrokerClientAuth = &BrokerClientAuth{Method: "token", TokenFile: tokenFile}
	})
	return proxyRoleSetup{srv: srv, files: files, tokenFile: tokenFile, logs: logs, fb: fb}
}

// dialWithCert opens a TLS connection to the proxy's TLS port presenting the given certificate.
func (p proxyRoleSetup) dialWithCert(t *testing.T, certFile, keyFile string) *tls.Conn {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.Dial("tcp", p.srv.TLSAddr(), tlsClientConfig(t, p.files.CA, cert))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// tlsAuthConnect is a client's CONNECT for TLS client-certificate authentication; it also
// names an original principal of its own, which the proxy must not pass on.
func tlsAuthConnect() *pulsarpb.BaseCommand {
	return &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_CONNECT.Enum(), Connect: &pulsarpb.CommandConnect{
		ClientVersion: proto.String("test-client"), ProtocolVersion: proto.Int32(20),
		AuthMethodName: proto.String("tls"), OriginalPrincipal: proto.String("admin"),
	}}
}

// Given a proxy that authenticates certificate clients with its own token (broker-client-auth),
// when a client presenting the CA-signed certificate "client" sends CONNECT with auth method
// "tls" (and an original_principal of its own),
// then the broker gets the proxy's token as the credential, "client" as original_principal and
// "tls" as original_auth_method, and the client gets the broker's CONNECTED.
func TestCertificateClientConnectsAsTheProxyRoleForItsPrincipal(t *testing.T) {
	p := startProxyRole(t)
	c := p.dialWithCert(t, p.files.ClientCert, p.files.ClientKey)

	send(t, c, frame(t, tlsAuthConnect()))

	broker := p.fb.accept(t)
	cmd, _ := expect(t, broker, pulsarpb.BaseCommand_CONNECT)
	got := cmd.GetConnect()
	if got.GetAuthMethodName() != "token" || string(got.GetAuthData()) != "proxy-token-1" ||
		got.GetOriginalPrincipal() != "client" || got.GetOriginalAuthMethod() != "tls" || len(got.GetOriginalAuthData()) != 0 {
		t.Fatalf("broker got CONNECT %v", got)
	}
	send(t, broker, frame(t, connectedCmd(1<<20)))
	expect(t, c, pulsarpb.BaseCommand_CONNECTED)
}

// Given a certificate client connected through the proxy role,
// when the broker sends AUTH_CHALLENGE (its credential check) after the token file was rotated,
// then the proxy answers with its current token, the client never sees the challenge, and an
// AUTH_RESPONSE the client sent of its own accord never reaches the broker.
func TestBrokerChallengeOnAProxyRoleConnectionIsAnsweredByTheProxy(t *testing.T) {
	p := startProxyRole(t)
	c := p.dialWithCert(t, p.files.ClientCert, p.files.ClientKey)
	send(t, c, frame(t, tlsAuthConnect()))
	broker := p.fb.accept(t)
	expect(t, broker, pulsarpb.BaseCommand_CONNECT)
	send(t, broker, frame(t, connectedCmd(1<<20)))
	expect(t, c, pulsarpb.BaseCommand_CONNECTED)
	if err := os.WriteFile(p.tokenFile, []byte("proxy-token-2"), 0o600); err != nil {
		t.Fatal(err)
	}
	send(t, c, frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_AUTH_RESPONSE.Enum(),
		AuthResponse: &pulsarpb.CommandAuthResponse{Response: &pulsarpb.AuthData{AuthMethodName: proto.String("tls"), AuthData: []byte("client-data")}}}))

	send(t, broker, frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_AUTH_CHALLENGE.Enum(),
		AuthChallenge: &pulsarpb.CommandAuthChallenge{Challenge: &pulsarpb.AuthData{AuthMethodName: proto.String("token"), AuthData: []byte("refresh")}}}))
	send(t, broker, frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PING.Enum(), Ping: &pulsarpb.CommandPing{}}))

	cmd, _ := expect(t, broker, pulsarpb.BaseCommand_AUTH_RESPONSE)
	if r := cmd.GetAuthResponse().GetResponse(); r.GetAuthMethodName() != "token" || string(r.GetAuthData()) != "proxy-token-2" {
		t.Fatalf("proxy answered %v", r)
	}
	expect(t, c, pulsarpb.BaseCommand_PING) // the first frame the client sees
}

// Given a proxy that authenticates certificate clients as the proxy role,
// when a client whose certificate the listener cannot verify tries (expired; signed by another
// CA), or a verified client sends a token CONNECT,
// then the first two are refused in the TLS handshake with a log line naming the reason, and
// the token client's CONNECT goes to the broker unchanged (no original principal).
func TestOnlyVerifiedCertificatesGetTheProxyRole(t *testing.T) {
	for _, bad := range []struct{ name, reason string }{{"expired", "expired"}, {"untrusted", "unknown authority"}} {
		// One proxy each: refused handshakes are logged once per interval.
		p := startProxyRole(t)
		files := map[string][2]string{"expired": {p.files.ExpiredClientCert, p.files.ExpiredClientKey},
			"untrusted": {p.files.UntrustedClientCert, p.files.UntrustedClientKey}}[bad.name]
		cert, err := tls.LoadX509KeyPair(files[0], files[1])
		if err != nil {
			t.Fatal(err)
		}
		conf := tlsClientConfig(t, p.files.CA)
		// Present it whatever CAs the proxy asks for (Go's client would otherwise send none).
		conf.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
		c, err := tls.Dial("tcp", p.srv.TLSAddr(), conf)
		if err == nil {
			send(t, c, frame(t, tlsAuthConnect()))
			expectClosed(t, c)
			c.Close()
		}
		p.logs.waitFor(t, bad.reason)
	}

	p := startProxyRole(t)
	c := p.dialWithCert(t, p.files.OtherClientCert, p.files.OtherClientKey)
	send(t, c, frame(t, connectCmd("")))
	cmd, _ := expect(t, p.fb.accept(t), pulsarpb.BaseCommand_CONNECT)
	if got := cmd.GetConnect(); got.GetAuthMethodName() != "token" || string(got.GetAuthData()) != "secret-token" || got.OriginalPrincipal != nil {
		t.Fatalf("a token client's CONNECT was changed: %v", got)
	}
}

// Given a proxy speaking TLS to a broker with a certificate of its own and no broker-client-auth,
// when a TLS client sends CONNECT with auth method "tls",
// then it is refused with AuthenticationError and a log line, and no broker connection is made:
// the broker would have authenticated the client as the proxy's certificate.
func TestTLSAuthWithoutBrokerClientAuthIsRefusedWhenTheProxyHasACertificate(t *testing.T) {
	files, err := testcert.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	fb := newFakeTLSBroker(t, files, "127.0.0.1")
	srv, _, logs := startProxy(t, []string{fb.addr()}, func(c *Config) {
		c.BrokerTLS, c.BrokerTLSTrustCertsFile, c.BrokerTLSCertFile, c.BrokerTLSKeyFile = true, files.CA, files.ProxyCert, files.ProxyKey
		c.TLSListen, c.TLSCertFile, c.TLSKeyFile = "127.0.0.1:0", files.ServerCert, files.ServerKey
	})
	c, err := tls.Dial("tcp", srv.TLSAddr(), tlsClientConfig(t, files.CA))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	send(t, c, frame(t, tlsAuthConnect()))

	cmd, _ := expect(t, c, pulsarpb.BaseCommand_ERROR)
	if cmd.GetError().GetError() != pulsarpb.ServerError_AuthenticationError || !strings.Contains(cmd.GetError().GetMessage(), "broker-client-auth") {
		t.Fatalf("client got %v", cmd.GetError())
	}
	logs.waitFor(t, "client authentication refused")
	select {
	case <-fb.conns:
		t.Fatal("the proxy connected to the broker")
	default:
	}
}

// Given broker-client-auth, when the rest of the configuration cannot support it, then the
// configuration is refused with a message naming what is missing.
func TestBrokerClientAuthNeedsWhatItUses(t *testing.T) {
	base := func() Config {
		c := DefaultConfig()
		c.Brokers = []string{"127.0.0.1:6650"}
		c.TLSListen, c.TLSCertFile, c.TLSKeyFile, c.TLSClientCAFile = "127.0.0.1:0", "c.pem", "k.pem", "ca.pem"
		return c
	}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"tls without a broker certificate", func(c *Config) { c.BrokerClientAuth = &BrokerClientAuth{Method: "tls"} }, "broker-tls-cert"},
		{"token file missing", func(c *Config) {
			c.BrokerClientAuth = &BrokerClientAuth{Method: "token", TokenFile: filepath.Join(t.TempDir(), "none")}
		}, "no such file"},
		{"no client CA", func(c *Config) {
			c.BrokerTLS, c.BrokerTLSCertFile, c.BrokerTLSKeyFile = true, "p.pem", "pk.pem"
			c.BrokerClientAuth, c.TLSClientCAFile = &BrokerClientAuth{Method: "tls"}, ""
		}, "tls-client-ca"},
		{"unknown method", func(c *Config) { c.BrokerClientAuth = &BrokerClientAuth{Method: "basic"} }, "want tls or token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.mod(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error naming %q", err, tc.want)
			}
		})
	}
}
