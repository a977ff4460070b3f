package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"time"
)

// The client-facing TLS listener (pulsar+ssl://): crypto/tls on a net.Conn,
// so its sessions run on the net.Conn transport (connside.go), beside the
// gnet engine that serves plaintext clients. Brokers are dialled in
// plaintext. Lookup answers give TLS clients a pulsar+ssl:// broker URL
// (setTLSURL), so they come back to this listener.

// tlsServer is the TLS listener's state.
type tlsServer struct {
	ln   net.Listener
	cert atomic.Pointer[tls.Certificate]
	conf *tls.Config
}

// loadTLS reads the certificate, key and client CA files named by cfg.
func loadTLS(cfg *Config) (*tlsServer, error) {
	t := &tlsServer{}
	if err := t.reload(cfg); err != nil {
		return nil, err
	}
	t.conf = &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return t.cert.Load(), nil },
	}
	if cfg.TLSClientCAFile != "" {
		pem, err := os.ReadFile(cfg.TLSClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("tls-client-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls-client-ca: no PEM certificate in %s", cfg.TLSClientCAFile)
		}
		t.conf.ClientCAs = pool
		t.conf.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return t, nil
}

func (t *tlsServer) reload(cfg *Config) error {
	c, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
	if err != nil {
		return fmt.Errorf("tls-cert / tls-key: %w", err)
	}
	t.cert.Store(&c)
	return nil
}

// ReloadTLS re-reads the TLS certificate and key (on SIGHUP); connections
// already open keep theirs, new handshakes get the new one. A failed read
// keeps the old one. Any goroutine may call it.
func (s *Server) ReloadTLS() error {
	if s.tls == nil {
		return errors.New("no TLS listener configured")
	}
	return s.tls.reload(&s.cfg)
}

// TLSAddr returns the binary TLS listener's address ("" if none). Any goroutine
// may call it once Serve has started listening (Addr returned).
func (s *Server) TLSAddr() string {
	if s.tls == nil || s.tls.ln == nil {
		return ""
	}
	return s.tls.ln.Addr().String()
}

// listenTLS opens the TLS listener; acceptTLS serves it. Called by Serve.
func (s *Server) listenTLS() error {
	ln, err := net.Listen("tcp", s.cfg.TLSListen)
	if err != nil {
		return fmt.Errorf("tls-listen: %w", err)
	}
	s.tls.ln = ln
	go s.acceptLoop(ln, func(nc net.Conn) { s.serveNetConn(nc, true, "") })
	return nil
}

// acceptLoop accepts ln's connections until it is closed and serves each
// on a goroutine of its own. It runs on a goroutine of its own.
func (s *Server) acceptLoop(ln net.Listener, serve func(net.Conn)) {
	for {
		nc, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.log.Warn("accept failed", "listen", ln.Addr().String(), "err", err.Error())
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go serve(nc)
	}
}

// serveNetConn completes the TLS handshake when useTLS (bounded by
// HandshakeTimeout) and starts the client's session on a connLoop of its
// own. pinned, when set, is the broker a CONNECT naming no
// proxy_to_broker_url goes to (a per-broker port).
func (s *Server) serveNetConn(nc net.Conn, useTLS bool, pinned string) {
	if s.draining.Load() {
		_ = nc.Close()
		return
	}
	// TLS runs over a rawConn, so the session's writes go to the socket
	// without a writer goroutine (connside_raw.go).
	conn := net.Conn(newRawConn(nc))
	var role string
	var verified bool
	if useTLS {
		tc := tls.Server(conn, s.tls.conf)
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.HandshakeTimeout)
		err := tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			s.m.tlsHandshakeFailures.Add(1)
			if ok, suppressed := s.tlsRefusals.allow(s.clock()); ok {
				s.log.Warn("TLS handshake failed; connection closed", "client", nc.RemoteAddr().String(),
					"listen", nc.LocalAddr().String(), "reason", tlsReason(err), "suppressed_since_last", suppressed)
			}
			_ = nc.Close()
			return
		}
		conn = tc
		role, verified = certRole(tc.ConnectionState().VerifiedChains)
	}
	s.m.connsTotal[0].Add(1)
	s.m.connsOpen[0].Add(1)
	loop := newConnLoop()
	ss := newSession(s, loop, nc.RemoteAddr().String())
	ss.tlsClient = useTLS
	ss.clientCertRole, ss.clientCertVerified = role, verified
	ss.pinnedBroker = pinned
	ss.dial = s.dialConnSide
	s.sessions.Store(ss, struct{}{})
	s.nsessions.Add(1)
	// On the loop, so the reader's first input finds s.client set.
	_ = loop.run(func() { ss.client = newConnSide(loop, &ss.clientEnd, conn) })
}

// tlsReason names why a TLS handshake failed, for the log.
func tlsReason(err error) string {
	var rec tls.RecordHeaderError
	switch {
	case errors.As(err, &rec):
		return "not TLS (plaintext on the TLS port?): " + err.Error()
	case errors.Is(err, context.DeadlineExceeded):
		return "no handshake within the handshake timeout"
	}
	return err.Error()
}
