package harness

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/rebatchproxy/rebatchproxy/proxy"
)

// InProcessProxy is a proxy the test process runs in front of a broker.
type InProcessProxy struct {
	URL  string // pulsar://host:port
	Addr string // host:port
	// Server is the running proxy, e.g. for its metrics (Server.Collector).
	Server *proxy.Server
	stop   func()
}

// Stop shuts the proxy down and waits for it.
func (p *InProcessProxy) Stop() { p.stop() }

// StartProxy runs the proxy in-process on a free loopback port in front of serviceURL, with
// proxy.DefaultConfig (every topic passthrough, duplicate chunks removed) changed by mod when
// mod is not nil. Logs are discarded unless mod sets a logger.
func StartProxy(serviceURL string, mod func(*proxy.Config)) (*InProcessProxy, error) {
	addr, err := proxy.BrokerAddress(serviceURL)
	if err != nil {
		return nil, err
	}
	cfg := proxy.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Brokers = []string{addr}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if mod != nil {
		mod(&cfg)
	}
	srv, err := proxy.New(cfg)
	if err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	la := srv.Addr(ctx)
	if la == "" {
		return nil, fmt.Errorf("proxy did not start: %v", <-done)
	}
	return &InProcessProxy{URL: "pulsar://" + la, Addr: la, Server: srv, stop: func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}}, nil
}
