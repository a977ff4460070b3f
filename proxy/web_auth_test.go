package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/rebatchproxy/rebatchproxy/internal/testcert"
)

// seenRequest is what a fake broker web service saw of one request.
type seenRequest struct {
	principal, authorization, peerCN string
	hadPrincipal                     bool
}

// fakeBrokerWeb is a broker web service (HTTPS when files is given, asking for a client
// certificate) that records each request's credentials.
func fakeBrokerWeb(t *testing.T, files *testcert.Files) (string, chan seenRequest) {
	t.Helper()
	seen := make(chan seenRequest, 4)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := seenRequest{principal: r.Header.Get(headerOriginalPrincipal), authorization: r.Header.Get("Authorization")}
		_, s.hadPrincipal = r.Header[headerOriginalPrincipal]
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			s.peerCN = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		seen <- s
		io.WriteString(w, "[]")
	})
	if files == nil {
		b := httptest.NewServer(h)
		t.Cleanup(b.Close)
		return b.URL, seen
	}
	b := httptest.NewUnstartedServer(h)
	cert, err := tls.LoadX509KeyPair(files.ServerCert, files.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	b.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequestClientCert}
	b.StartTLS()
	t.Cleanup(b.Close)
	_, port, _ := net.SplitHostPort(b.Listener.Addr().String())
	return "https://localhost:" + port, seen
}

// webClient is an HTTPS client trusting the test CA, presenting cert/key when given.
func webClient(t *testing.T, files testcert.Files, cert, key string) *http.Client {
	t.Helper()
	pem, err := os.ReadFile(files.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	tc := &tls.Config{RootCAs: pool}
	if cert != "" {
		c, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			t.Fatal(err)
		}
		tc.Certificates = []tls.Certificate{c}
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
}

// Given an HTTPS web port requiring client certificates from the test CA, with the proxy's
// credential towards the brokers set (its token, or its certificate towards an https:// broker
// web service),
// when a client sends an admin request, with its certificate and with or without a token of
// its own, naming another principal in X-Original-Principal,
// then a certificate-only request reaches the broker with the proxy's credential and the
// certificate's role as the original principal; a request with its own token passes through
// with that token and no principal; the client's X-Original-Principal never reaches the broker.
func TestWebPortForwardsAClientCertificateAsTheOriginalPrincipal(t *testing.T) {
	files, err := testcert.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "proxy.token")
	if err := os.WriteFile(tokenFile, []byte("proxy-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		method     string
		clientAuth string // the client's own Authorization header
		want       seenRequest
	}{
		{"token credential, certificate only", authMethodToken, "", seenRequest{principal: "client", authorization: "Bearer proxy-token", hadPrincipal: true}},
		{"token credential, the client's own token", authMethodToken, "Bearer client-token", seenRequest{authorization: "Bearer client-token"}},
		{"certificate credential, certificate only", authMethodTLS, "", seenRequest{principal: "client", peerCN: "proxy", hadPrincipal: true}},
		{"certificate credential, the client's own token", authMethodTLS, "Bearer client-token", seenRequest{authorization: "Bearer client-token"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var brokerFiles *testcert.Files
			if tc.method == authMethodTLS {
				brokerFiles = &files
			}
			webURL, seen := fakeBrokerWeb(t, brokerFiles)
			fb := newFakeBroker(t)
			srv, _, _ := startProxy(t, []string{fb.addr()}, func(c *Config) {
				c.WebTLSListen, c.BrokerWebURLs = "127.0.0.1:0", []string{webURL}
				c.TLSCertFile, c.TLSKeyFile, c.TLSClientCAFile = files.ServerCert, files.ServerKey, files.CA
				c.BrokerClientAuth = &BrokerClientAuth{Method: tc.method, TokenFile: tokenFile}
				if tc.method == authMethodTLS {
					c.BrokerTLS, c.BrokerTLSTrustCertsFile = true, files.CA
					c.BrokerTLSCertFile, c.BrokerTLSKeyFile = files.ProxyCert, files.ProxyKey
				}
			})
			_, port, _ := net.SplitHostPort(srv.WebAddrs()[0])
			req, _ := http.NewRequest(http.MethodGet, "https://localhost:"+port+"/admin/v2/tenants", nil)
			req.Header.Set(headerOriginalPrincipal, "admin")
			if tc.clientAuth != "" {
				req.Header.Set("Authorization", tc.clientAuth)
			}

			resp, err := webClient(t, files, files.ClientCert, files.ClientKey).Do(req)

			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if got := <-seen; got != tc.want {
				t.Errorf("the broker saw %+v, want %+v", got, tc.want)
			}
		})
	}
}

// Given an HTTPS web port requiring client certificates from the test CA,
// when clients connect with a certificate from another CA, an expired one, or none,
// then each TLS handshake is refused, with a log line naming the reason, and no request
// reaches the broker.
func TestWebPortRefusesUntrustedClientCertificates(t *testing.T) {
	files, err := testcert.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	webURL, seen := fakeBrokerWeb(t, nil)
	fb := newFakeBroker(t)
	srv, _, logs := startProxy(t, []string{fb.addr()}, func(c *Config) {
		c.WebTLSListen, c.BrokerWebURLs = "127.0.0.1:0", []string{webURL}
		c.TLSCertFile, c.TLSKeyFile, c.TLSClientCAFile = files.ServerCert, files.ServerKey, files.CA
	})
	_, port, _ := net.SplitHostPort(srv.WebAddrs()[0])
	for _, tc := range []struct{ name, cert, key, logged string }{
		// Go's TLS client sends no certificate the server's list of acceptable CAs rules out.
		{"another CA", files.UntrustedClientCert, files.UntrustedClientKey, "didn't provide a certificate"},
		{"expired", files.ExpiredClientCert, files.ExpiredClientKey, "expired"},
		{"none", "", "", "didn't provide a certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := webClient(t, files, tc.cert, tc.key).Get("https://localhost:" + port + "/admin/v2/tenants")

			if err == nil {
				resp.Body.Close()
				t.Fatalf("answered %d, want a refused handshake", resp.StatusCode)
			}
			logs.waitFor(t, tc.logged)
		})
	}
	select {
	case s := <-seen:
		t.Errorf("a request reached the broker: %+v", s)
	default:
	}
}
