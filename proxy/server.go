package proxy

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/rebatchproxy/rebatchproxy/chunkdedup"
	"github.com/rebatchproxy/rebatchproxy/keyshared"
)

// Server is the proxy: one gnet engine serving clients, with each client's
// broker connection enrolled on the client's event loop.
//
// Goroutines: New, Serve, Shutdown, Addr, Ready, Collector and Draining may
// be called from any goroutine. The gnet callbacks (OnBoot, OnOpen,
// OnTraffic, OnClose) run on event loops and are called only by gnet;
// OnTick runs on gnet's ticker goroutine and touches sessions only through
// atomics and EventLoop.Execute.
type Server struct {
	gnet.BuiltinEventEngine

	cfg   Config
	log   *slog.Logger
	m     *metrics
	known *knownBrokers
	// readArrays lends the read arrays of the net.Conn transport (connside_chunks.go).
	readArrays *readArrays
	// ks manages the Key_Shared subscriptions Config.ManagedKeyShared claims; nil if none.
	ks *keyshared.Manager
	// loops is the number of event loops Serve runs (written before gnet.Run, read in OnBoot).
	loops int

	eng      gnet.Engine
	engMu    sync.Mutex
	booted   chan struct{}
	draining atomic.Bool

	sessions  sync.Map // *session -> struct{}
	nsessions atomic.Int64
	nextID    atomic.Uint64
	now       atomic.Int64 // coarse clock (unix ns), refreshed by OnTick
	// clock is the time source of the server and its sessions (time.Now;
	// core specs inject their own). Any goroutine may call it.
	clock func() time.Time
	// dialBroker starts connecting a session to its broker (the gnet
	// transport's dialGnet; core specs put their own). Called on the loop.
	dialBroker func(s *session, targets []string)
	held       atomic.Int64 // bytes all sessions hold (the memory budget's measure)
	// tls is the client-facing TLS listener (server_tls.go), nil if none.
	tls         *tlsServer
	tlsRefusals sharedLogEvery // failed TLS handshakes, one log line per 10 s
	// brokerTLS is the TLS configuration towards brokers (broker_tls.go), nil
	// for plaintext brokers.
	brokerTLS *tls.Config
	// The web port (web.go); written by Serve before the engine boots.
	webServers []*http.Server
	webAddrs   []string
	// brokerPorts are the per-broker listeners (broker_ports.go), set by
	// Serve before the engine starts.
	brokerPorts []*brokerPort
}

// tickInterval is how often timeouts are checked (and the slowest pace of a
// session's resume checks); pausedTick is the pace of a session's first
// resume checks once it has paused or parked (backpressure.go).
const (
	tickInterval = 100 * time.Millisecond
	pausedTick   = 2 * time.Millisecond
	minTick      = 250 * time.Microsecond
)

// New checks cfg and returns a Server that is not yet serving.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ProducerPaths == nil {
		// Every topic passthrough, duplicate chunks removed (DESIGN: on under every policy).
		cfg.ProducerPaths = RebatchPaths(nil, nil, NewChunkDedup(chunkdedup.Config{}), cfg.Logger)
	}
	s := &Server{
		cfg:    cfg,
		log:    cfg.Logger,
		m:      newMetrics(),
		known:  newKnownBrokers(cfg.Brokers, cfg.AllowedBrokers),
		booted: make(chan struct{}),
	}
	s.m.knownBrokers = s.known.count
	if cfg.ManagedKeyShared != nil {
		s.ks = keyshared.NewManager(keyshared.Config{AwayTimeout: cfg.KeySharedAwayTimeout, Log: s.log})
	}
	if cfg.BrokerTLS {
		bt, err := loadBrokerTLS(&s.cfg)
		if err != nil {
			return nil, err
		}
		s.brokerTLS = bt
	}
	if cfg.TLSListen != "" || cfg.WebTLSListen != "" || cfg.BrokerPortsTLSListen != "" {
		t, err := loadTLS(&s.cfg)
		if err != nil {
			return nil, err
		}
		s.tls = t
	}
	s.clock = time.Now
	s.dialBroker = s.dialGnet
	if s.brokerTLS != nil {
		s.dialBroker = s.dialConnSide // a TLS broker connection cannot be a gnet conn
	}
	s.readArrays = newReadArrays(cfg.MemoryBudget, s.softLimit)
	s.m.held = s.held.Load
	s.m.budget = int64(cfg.MemoryBudget)
	s.now.Store(s.clock().UnixNano())
	return s, nil
}

// Collector returns the Prometheus collector of the server's metrics.
func (s *Server) Collector() prometheus.Collector { return s.m }

// Serve runs the engine until Shutdown; it blocks. Call it once.
func (s *Server) Serve() error {
	loops := s.cfg.EventLoops
	opts := []gnet.Option{
		gnet.WithTicker(true),
		// A proxy restarted after a crash must bind at once, not after the old
		// connections leave TIME_WAIT: clients are reconnecting.
		gnet.WithReuseAddr(true),
		gnet.WithReadBufferCap(s.cfg.ReadBufferCap),
		gnet.WithTCPNoDelay(gnet.TCPNoDelay),
		gnet.WithLogger(gnetLogger{s.log}),
	}
	loops = sizeRuntime(loops)
	s.loops = loops
	opts = append(opts, gnet.WithNumEventLoop(loops))
	if s.cfg.TLSListen != "" {
		if err := s.listenTLS(); err != nil {
			close(s.booted)
			return err
		}
	}
	if err := s.listenBrokerPorts(); err != nil {
		close(s.booted)
		return err
	}
	if err := s.serveWeb(); err != nil {
		close(s.booted)
		return err
	}
	err := gnet.Run(s, "tcp://"+s.cfg.Listen, opts...)
	select {
	case <-s.booted:
	default:
		close(s.booted) // unblock Addr callers on a failed start
	}
	return err
}

// Addr waits until the engine listens and returns its address (useful
// with port 0). It returns "" if the engine failed to start or ctx ends.
func (s *Server) Addr(ctx context.Context) string {
	select {
	case <-s.booted:
	case <-ctx.Done():
		return ""
	}
	s.engMu.Lock()
	eng := s.eng
	s.engMu.Unlock()
	fd, err := eng.Dup()
	if err != nil {
		return ""
	}
	defer unix.Close(fd)
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return ""
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return net.JoinHostPort(net.IP(a.Addr[:]).String(), strconv.Itoa(a.Port))
	case *unix.SockaddrInet6:
		return net.JoinHostPort(net.IP(a.Addr[:]).String(), strconv.Itoa(a.Port))
	}
	return ""
}

// Ready reports whether the server accepts clients (booted, not draining).
func (s *Server) Ready() bool {
	select {
	case <-s.booted:
	default:
		return false
	}
	return !s.draining.Load()
}

// Draining reports whether Shutdown has begun.
func (s *Server) Draining() bool { return s.draining.Load() }

// Shutdown stops taking new clients (they are accepted and closed at once,
// since gnet cannot close its listener separately), waits until every
// connection has ended or ctx is done, then closes what is left and stops
// the engine.
func (s *Server) Shutdown(ctx context.Context) error {
	s.draining.Store(true)
	select {
	case <-s.booted:
	case <-ctx.Done():
		return ctx.Err()
	}
	if s.tls != nil && s.tls.ln != nil {
		_ = s.tls.ln.Close() // unlike gnet's, this listener can stop alone
	}
	s.closeBrokerPorts()
	s.stopWeb(ctx)
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for s.nsessions.Load() > 0 {
		select {
		case <-ctx.Done():
			goto forced
		case <-t.C:
		}
	}
forced:
	if n := s.nsessions.Load(); n > 0 {
		s.log.Info("drain deadline reached; closing connections", "open", n)
		s.sessions.Range(func(k, _ any) bool {
			k.(*session).closeAsync(ErrShutdown)
			return true
		})
		// Let the loops run the closes (and flush residual output).
		wait, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		for s.nsessions.Load() > 0 && wait.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
	}
	s.engMu.Lock()
	eng := s.eng
	s.engMu.Unlock()
	stopCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return eng.Stop(stopCtx)
}

// OnBoot implements gnet.EventHandler; gnet calls it once, before serving.
func (s *Server) OnBoot(eng gnet.Engine) gnet.Action {
	s.engMu.Lock()
	s.eng = eng
	s.engMu.Unlock()
	close(s.booted)
	s.log.Info("proxy listening", "listen", s.cfg.Listen, "brokers", s.cfg.Brokers, "event_loops", s.loops, "gomaxprocs", runtime.GOMAXPROCS(0))
	return gnet.None
}

// OnOpen implements gnet.EventHandler; it runs on the connection's loop for
// both accepted clients and enrolled broker connections (whose gnet context
// is their session end).
func (s *Server) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	if e, ok := c.Context().(*end); ok {
		if k, _ := e.side().(*sock); k != nil && k.mode == returning {
			return k.onReturn(c) // a parked socket back on the loop
		}
		c.SetContext(e)
		out, ok := e.s.onBrokerOpen(newSock(e, c))
		if !ok {
			return nil, gnet.Close
		}
		return out, gnet.None
	}
	s.m.connsTotal[0].Add(1)
	s.m.connsOpen[0].Add(1)
	if s.draining.Load() {
		c.SetContext(nil)
		return nil, gnet.Close
	}
	ss := newSession(s, gnetExec{c.EventLoop()}, c.RemoteAddr().String())
	ss.client = newSock(&ss.clientEnd, c)
	c.SetContext(&ss.clientEnd)
	s.sessions.Store(ss, struct{}{})
	s.nsessions.Add(1)
	return nil, gnet.None
}

// OnTraffic implements gnet.EventHandler; it runs on the connection's loop.
// A panic while handling one connection's frames (a bug, never expected)
// closes that connection with the panic and stack in the log; it must not
// take the other connections down with the process.
func (s *Server) OnTraffic(c gnet.Conn) (action gnet.Action) {
	e, ok := c.Context().(*end)
	if !ok {
		_, _ = c.Discard(-1)
		return gnet.Close
	}
	defer func() {
		if v := recover(); v != nil {
			s.m.panics.Add(1)
			e.s.logger().Error("BUG: panic while handling a connection; closing it", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			if e.s.reason == nil {
				e.s.reason = fmt.Errorf("%w: %v", ErrInternal, v)
			}
			if k, _ := e.side().(*sock); k != nil && k.mode == leaving {
				k.closeWanted = true
			}
			action = gnet.Close
		}
	}()
	k, _ := e.side().(*sock)
	if k == nil || k.c != c || e.s.state == stClosed {
		_, _ = c.Discard(-1) // a stale conn, or a session already closed
		return gnet.None
	}
	if e.s.onTraffic(e) == closeSide {
		if k.mode == leaving {
			k.closeWanted = true // the queued park-close must end in a close
		}
		return gnet.Close
	}
	return gnet.None
}

// OnClose implements gnet.EventHandler; it runs on the connection's loop.
func (s *Server) OnClose(c gnet.Conn, err error) gnet.Action {
	e, ok := c.Context().(*end)
	if !ok { // a client refused while draining
		s.m.connsOpen[0].Add(-1)
		return gnet.None
	}
	k, _ := e.side().(*sock)
	switch {
	case k != nil && k.onGnetClose(c):
		// A socket leaving the loop to be parked; the session goes on.
	case k == nil || k.c != c:
		s.m.connsOpen[1].Add(-1) // a late dial for a session already closed
	default:
		e.s.onClose(e, k, err)
		k.mode, k.c = gone, nil
	}
	return gnet.None
}

// OnTick implements gnet.EventHandler. It runs on gnet's ticker goroutine:
// it refreshes the coarse clock and asks the loops (EventLoop.Execute) to
// time out or resume sessions; it never touches a connection directly.
func (s *Server) OnTick() (time.Duration, gnet.Action) {
	now := s.clock().UnixNano()
	s.now.Store(now)
	idle := int64(s.cfg.IdleTimeout)
	next := int64(tickInterval)
	s.sessions.Range(func(k, _ any) bool {
		ss := k.(*session)
		switch {
		case ss.handshakeDeadline.Load() != 0 && now > ss.handshakeDeadline.Load():
			ss.closeAsync(ErrHandshakeTimeout)
		case idle > 0 && now-ss.lastActive.Load() > idle && !ss.needsResume():
			// (A pair slowed by backpressure is not idle: its slow side holds it.)
			ss.closeAsync(fmt.Errorf("%w: nothing moved for %s", ErrIdleTimeout, s.cfg.IdleTimeout))
		case ss.drainDeadline.Load() != 0 && now > ss.drainDeadline.Load():
			ss.closeAsync(ErrChunkDrainTimeout)
		case ss.needsResume():
			ss.resumeAsync() // a fallback: the session's own timer checks sooner
		}
		if kd := ss.ksDeadline.Load(); kd != 0 {
			if now >= kd {
				ss.ksTickAsync()
			} else {
				next = min(next, kd-now)
			}
		}
		if pd := ss.pathDeadline.Load(); pd != 0 {
			if now >= pd {
				ss.tickAsync()
			} else {
				next = min(next, pd-now)
			}
		}
		return true
	})
	// A producer path's deadline (a batch's max delay) sets the pace, down to
	// minTick so a flood of deadlines cannot spin the ticker.
	return time.Duration(max(next, int64(minTick))), gnet.None
}

// dialGnet connects s to the first reachable target and enrolls the
// connection on the client's event loop, whose OnOpen hands it to the
// session (onBrokerOpen). Called on the loop; dials on a goroutine of its own.
func (srv *Server) dialGnet(s *session, targets []string) {
	el := s.client.(*sock).loop
	go srv.dialAndEnroll(s, el, targets)
}

func (srv *Server) dialAndEnroll(s *session, el gnet.EventLoop, targets []string) {
	d := net.Dialer{Timeout: srv.cfg.ConnectTimeout}
	var nc net.Conn
	var err error
	for _, a := range targets {
		if nc, err = d.Dial("tcp", a); err == nil {
			s.brokerAddr = a
			break
		}
	}
	if err == nil {
		var ch <-chan gnet.RegisteredResult
		ch, err = el.Enroll(gnet.NewContext(context.Background(), &s.brokerEnd), nc)
		if err == nil {
			if res := <-ch; res.Err != nil {
				err = res.Err
			}
		} else {
			_ = nc.Close()
		}
	}
	if err == nil {
		return
	}
	s.dialFailed(err)
}

// gnetLogger sends gnet's own log lines to slog (gnet info lines at debug).
// gnet calls it from any goroutine; slog loggers are safe for that.
type gnetLogger struct{ l *slog.Logger }

func (g gnetLogger) Debugf(f string, a ...any) { g.l.Debug("gnet: " + fmt.Sprintf(f, a...)) }
func (g gnetLogger) Infof(f string, a ...any)  { g.l.Debug("gnet: " + fmt.Sprintf(f, a...)) }
func (g gnetLogger) Warnf(f string, a ...any)  { g.l.Warn("gnet: " + fmt.Sprintf(f, a...)) }
func (g gnetLogger) Errorf(f string, a ...any) { g.l.Error("gnet: " + fmt.Sprintf(f, a...)) }
func (g gnetLogger) Fatalf(f string, a ...any) { g.l.Error("gnet: " + fmt.Sprintf(f, a...)) }
