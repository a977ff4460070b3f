// Command proxy runs the transparent Pulsar-protocol proxy: flags and a YAML
// config file, logging, the metrics/health HTTP endpoint, signals. The
// proxy itself lives in package proxy.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rebatchproxy/rebatchproxy/chunkdedup"
	"github.com/rebatchproxy/rebatchproxy/proxy"
	"github.com/rebatchproxy/rebatchproxy/rebatch"
	"github.com/rebatchproxy/rebatchproxy/route"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	o, err := parseArgs(args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxy:", err)
		return 2
	}
	log, err := newLogger(o.logLevel, o.logFormat)
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxy:", err)
		return 2
	}
	cfg, err := o.proxyConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxy: config:", err)
		return 2
	}
	cfg.Logger = log
	if cfg.MemoryBudget > 0 && os.Getenv("GOMEMLIMIT") == "" {
		// Half the budget bounds what connections hold (proxy.Config.MemoryBudget); the
		// runtime's soft limit at the budget keeps the garbage of bursts (buffers freed, not
		// yet collected) from stacking RSS on top of it.
		debug.SetMemoryLimit(int64(cfg.MemoryBudget))
	}
	policies := proxy.NewPolicies(o.policies)
	rm := proxy.NewRebatchMetrics()
	chunks := proxy.NewChunkDedup(chunkdedup.Config{})
	if reader, err := o.storedReader(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "proxy: config:", err)
		return 2
	} else if reader != nil {
		chunks.EnableRecovery(reader, log)
	}
	cfg.ProducerPaths = proxy.RebatchPaths(policies, rm, chunks, log)
	cfg.ManagedKeyShared = policies.ManagedKeyShared
	srv, err := proxy.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxy: config:", err)
		return 2
	}

	if o.metricsListen != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(srv.Collector(), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		reg.MustRegister(rm.Collectors()...)
		reg.MustRegister(chunks.Collectors()...)
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
			if !srv.Ready() {
				http.Error(w, "not ready", http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ready")
		})
		if o.pprof {
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
			mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		}
		// Bound here, before the proxy serves: a metrics port that cannot be had stops the
		// start with its reason, rather than leaving a proxy whose /readyz never answers
		// (a supervisor or a test would wait on it forever, or probe someone else's port).
		ml, err := net.Listen("tcp", o.metricsListen)
		if err != nil {
			fmt.Fprintln(os.Stderr, "proxy: metrics-listen:", err)
			return 1
		}
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := hs.Serve(ml); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics listener failed", "listen", o.metricsListen, "err", err)
			}
		}()
		defer hs.Close()
	}

	served := make(chan error, 1)
	go func() { served <- srv.Serve() }()

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
wait:
	for {
		select {
		case err := <-served:
			if err != nil {
				log.Error("proxy stopped", "err", err)
				return 1
			}
			return 0
		case s := <-sig:
			if s == syscall.SIGHUP {
				reloadPolicies(o.config, policies, log)
				if cfg.TLSListen != "" {
					if err := srv.ReloadTLS(); err != nil {
						log.Warn("SIGHUP: TLS certificate not reloaded; keeping the current one", "err", err)
					} else {
						log.Info("SIGHUP: TLS certificate reloaded", "cert", cfg.TLSCertFile)
					}
				}
				continue
			}
			log.Info("signal received; draining", "signal", s.String(), "drain_timeout", cfg.DrainTimeout)
			break wait
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		log.Error("shutdown", "err", err)
	}
	<-served
	log.Info("stopped")
	return 0
}

// reloadPolicies re-reads the policies of the config file (SIGHUP). A bad
// file keeps the current policies; producers already created keep theirs.
func reloadPolicies(file string, policies *proxy.Policies, log *slog.Logger) {
	if file == "" {
		log.Warn("SIGHUP: no --config file to reload policies from")
		return
	}
	data, err := os.ReadFile(file)
	if err == nil {
		var m *route.Matcher[rebatch.Policy]
		if m, err = loadPolicies(data); err == nil {
			policies.Store(m)
			log.Info("policies reloaded; new producers use them", "config", file)
			return
		}
	}
	log.Error("policies not reloaded; keeping the current ones", "config", file, "err", err)
}

func newLogger(level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log-level: %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("log-format: %q: want text or json", format)
}
