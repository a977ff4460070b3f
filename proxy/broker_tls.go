package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"

	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// TLS towards the brokers (Config.BrokerTLS): every broker connection the
// proxy opens (lookup, data, followed redirects) is TLS, with the trusted CA
// of BrokerTLSTrustCertsFile, hostname verification unless turned off, and
// an optional client certificate. A TLS broker connection cannot be a gnet
// conn, so the broker side of every session is then a connSide (net.Conn
// transport) driven by the session's own executor, whatever the client's
// transport. In this mode the proxy learns and dials the brokers' TLS
// addresses: lookup answers are rewritten to name the broker's TLS address
// in both brokerServiceUrl (pulsar://) and brokerServiceUrlTls (pulsar+ssl://),
// so whichever a client names, the proxy dials that address with TLS; an
// answer without a TLS URL keeps its plaintext one, and dialling it fails.

// BrokerTLSConfig is the client TLS configuration the proxy uses towards brokers (trusted
// CAs, client certificate, hostname check), for other clients of the brokers' services such
// as the admin API reader. Any goroutine may call it.
func BrokerTLSConfig(cfg *Config) (*tls.Config, error) { return loadBrokerTLS(cfg) }

// loadBrokerTLS builds the client TLS configuration for brokers.
func loadBrokerTLS(cfg *Config) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.BrokerTLSTrustCertsFile != "" {
		pem, err := os.ReadFile(cfg.BrokerTLSTrustCertsFile)
		if err != nil {
			return nil, fmt.Errorf("broker-tls-trust-certs: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("broker-tls-trust-certs: no PEM certificate in %s", cfg.BrokerTLSTrustCertsFile)
		}
		tc.RootCAs = pool
	}
	if cfg.BrokerTLSCertFile != "" {
		c, err := tls.LoadX509KeyPair(cfg.BrokerTLSCertFile, cfg.BrokerTLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("broker-tls-cert / broker-tls-key: %w", err)
		}
		tc.Certificates = []tls.Certificate{c}
	}
	tc.InsecureSkipVerify = cfg.BrokerTLSNoHostnameVerification
	if tc.InsecureSkipVerify {
		// Still verify the chain against the trusted CAs, only not the name.
		tc.VerifyConnection = func(cs tls.ConnectionState) error {
			opts := x509.VerifyOptions{Roots: tc.RootCAs, Intermediates: x509.NewCertPool()}
			for _, c := range cs.PeerCertificates[1:] {
				opts.Intermediates.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(opts)
			return err
		}
	}
	return tc, nil
}

// dialBrokerConn connects to a broker at addr: TCP, then TLS when the
// proxy speaks TLS to brokers (handshake bounded by ctx). Any goroutine.
func (s *Server) dialBrokerConn(ctx context.Context, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: s.cfg.ConnectTimeout}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil || s.brokerTLS == nil {
		return nc, err
	}
	tc := s.brokerTLS.Clone()
	if host, _, err := net.SplitHostPort(addr); err == nil {
		tc.ServerName = host
	}
	c := tls.Client(newRawConn(nc), tc) // see serveNetConn
	hctx, cancel := context.WithTimeout(ctx, s.cfg.ConnectTimeout)
	defer cancel()
	if err := c.HandshakeContext(hctx); err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("TLS with broker %s: %w", addr, err)
	}
	return c, nil
}

// dialConnSide dials the first reachable target and hands the connection to
// the session as a connSide on its executor (the net.Conn transport for the
// broker side: TLS brokers, or a TLS client's session). Called on the
// session's goroutine; dials on one of its own.
func (s *Server) dialConnSide(ss *session, targets []string) {
	go func() {
		var nc net.Conn
		var err error
		for _, a := range targets {
			if nc, err = s.dialBrokerConn(context.Background(), a); err == nil {
				ss.brokerAddr = a // published to the session's goroutine by run
				break
			}
		}
		if err != nil {
			ss.dialFailed(err)
			return
		}
		if ss.exec.run(func() {
			b := newConnSide(ss.exec, &ss.brokerEnd, nc)
			out, ok := ss.onBrokerOpen(b)
			if !ok {
				b.Close() // its finish runs the session's onClose, which counts it
				return
			}
			_, _ = b.Write(out)
		}) != nil {
			_ = nc.Close()
		}
	}()
}

// setBrokerTLSURLs points a lookup answer at the broker's TLS address in both
// URL fields (TLS to brokers); it returns that address ("" if the answer has
// no TLS URL, and is left as it is).
func setBrokerTLSURLs(r *pulsarpb.CommandLookupTopicResponse) string {
	a := addrOf(r.GetBrokerServiceUrlTls())
	if a == "" {
		return ""
	}
	plain, tlsURL := "pulsar://"+a, "pulsar+ssl://"+a
	r.BrokerServiceUrl, r.BrokerServiceUrlTls = &plain, &tlsURL
	return a
}
