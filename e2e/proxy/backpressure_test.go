package proxy_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rebatchproxy/rebatchproxy/e2e/faultrelay"
	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/proxy"
)

// produceAll sends n messages of size bytes asynchronously through url with a window of
// pending sends and a 1 GiB client memory limit, and returns the send errors and the time taken.
func produceAll(t *testing.T, url, topic string, n, size, window int) (failed int64, took time.Duration) {
	t.Helper()
	c, err := pulsar.NewClient(pulsar.ClientOptions{URL: url, OperationTimeout: 60 * time.Second,
		ConnectionTimeout: 10 * time.Second, Logger: quietLogger(), MemoryLimitBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true,
		MaxPendingMessages: window, SendTimeout: 3 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	payload := make([]byte, size)
	var wg sync.WaitGroup
	var errs atomic.Int64
	start := time.Now()
	for i := 0; i < n; i++ {
		wg.Add(1)
		p.SendAsync(context.Background(), &pulsar.ProducerMessage{Payload: payload}, func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
			if err != nil {
				errs.Add(1)
			}
			wg.Done()
		})
	}
	wg.Wait()
	return errs.Load(), time.Since(start)
}

// closedForBufferLimit is the proxy's count of pairs closed at the hard buffer limit.
func closedForBufferLimit(t *testing.T, srv *proxy.Server) float64 {
	v, _ := harness.MetricSum(t, []prometheus.Collector{srv.Collector()}, "rebatchproxy_closes_total", "reason", "buffer_limit")
	return v
}

// Given a link towards the broker throttled to 10 MB/s (a relay), and a pulsar-client-go
// producer with 1,000 sends of 100 KB in flight (100 MB, beyond the proxy's 64 MiB hard limit
// per direction),
// when it sends 1,000 messages directly through the relay and then through the proxy in front of
// the relay,
// then both paths store all 1,000 with every send acknowledged, and the proxy closes nobody: it
// slows the client by parking its socket instead.
func TestFastProducerOnASlowLinkIsSlowedNotDisconnected(t *testing.T) {
	b := harness.Default(t)
	addr, err := proxy.BrokerAddress(b.ServiceURL)
	if err != nil {
		t.Fatal(err)
	}
	slowLink := func(proxied bool) *faultrelay.Relay {
		r, err := faultrelay.Start(faultrelay.Config{Upstream: addr, RewriteLookups: true, RewriteProxiedLookups: proxied,
			ToServerRate: 10 << 20, Logf: t.Logf})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		return r
	}
	direct, behind := slowLink(false), slowLink(true)
	px, err := harness.StartProxy(behind.URL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Stop)
	const n, size = 1000, 100 << 10

	for _, path := range []struct {
		name, url string
		relay     *faultrelay.Relay
	}{{"direct", direct.URL(), direct}, {"proxy", px.URL, behind}} {
		relay := path.relay
		topic := uniqueTopic("slowlink-" + path.name)
		before := relay.Stats().FramesToServer
		failed, took := produceAll(t, path.url, topic, n, size, 1000)
		if through := relay.Stats().FramesToServer - before; through < n {
			t.Fatalf("%s: only %d frames went through the throttled relay; the sends took another way (relay: %+v)", path.name, through, relay.Stats())
		}
		stored, err := b.MessagesIn(ctxT(t, 30*time.Second), topic)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d stored, %d sends failed, %.1f s (%.1f MB/s)", path.name, stored, failed, took.Seconds(), float64(n*size)/took.Seconds()/1e6)
		if failed != 0 || stored != n {
			t.Errorf("%s: %d of %d sends failed, %d stored", path.name, failed, n, stored)
		}
	}
	if v := closedForBufferLimit(t, px.Server); v != 0 {
		t.Errorf("the proxy closed %v pairs at the buffer limit", v)
	}
	if v, _ := harness.MetricSum(t, []prometheus.Collector{px.Server.Collector()}, "rebatchproxy_backpressure_parks_total", "direction", "client_to_broker"); v == 0 {
		t.Error("the producer's socket was never parked: the throttle did not reach the proxy")
	}
}

// Given the proxy process (default memory budget, 256 MiB) and 8 consumers, each on its own
// connection and subscription with a receiver queue of 100,000, behind a relay that stops
// passing bytes towards them (clients that stop reading their sockets),
// when 200 MB (2,000 x 100 KB) are produced to their topic and the relay then resumes,
// then every consumer receives all 2,000 messages, nobody is disconnected, and the proxy's peak
// RSS stays under its budget (printed).
func TestStalledConsumersAreSlowedNotDisconnected(t *testing.T) {
	b := harness.Default(t)
	pp := harness.StartProcessProxy(t, b, "")
	relay, err := faultrelay.Start(faultrelay.Config{Upstream: pp.Listen(), Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = relay.Close() })
	topic := uniqueTopic("stalled")
	const consumers, n, size = 8, 2000, 100 << 10
	const budget = 256 << 20

	var cs []pulsar.Consumer
	for i := 0; i < consumers; i++ {
		c := newClient(t, relay.URL(), nil)
		sub, err := c.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: fmt.Sprintf("s%d", i),
			ReceiverQueueSize: 100000})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(sub.Close)
		cs = append(cs, sub)
	}
	rssBefore, _ := pp.PeakRSS()
	relay.HoldToClient()
	released := false
	defer func() {
		if !released {
			relay.ReleaseToClient()
		}
	}()

	// A window of 100: the standalone broker's 512 MiB of direct memory does not take 100 MB in
	// flight on top of 8 subscriptions' reads.
	failed, took := produceAll(t, b.ServiceURL, topic, n, size, 100)
	if failed != 0 {
		t.Fatalf("%d sends failed", failed)
	}
	time.Sleep(3 * time.Second) // let the broker push what the consumers' permits allow
	held := pp.MetricsText("rebatchproxy_buffered_bytes")
	parks := pp.MetricsText("rebatchproxy_backpressure_parks_total")
	relay.ReleaseToClient()
	released = true

	var wg sync.WaitGroup
	counts := make([]int, consumers)
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			seen := map[string]bool{}
			ctx := ctxT(t, 2*time.Minute)
			for len(seen) < n {
				m, err := c.Receive(ctx)
				if err != nil {
					return
				}
				seen[m.ID().String()] = true
				_ = c.Ack(m)
			}
			counts[i] = len(seen)
		}()
	}
	wg.Wait()
	peak, err := pp.PeakRSS()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("produced %.0f MB in %.1f s while %d consumers did not read; proxy peak RSS %.0f MiB (%.0f MiB before), budget %d MiB; while stalled:\n%s\n%s",
		n*size/1e6, took.Seconds(), consumers, float64(peak)/(1<<20), float64(rssBefore)/(1<<20), budget>>20, held, parks)
	for i, got := range counts {
		if got != n {
			t.Errorf("consumer %d received %d distinct messages of %d", i, got, n)
		}
	}
	if peak >= budget {
		t.Errorf("proxy peak RSS %d bytes, budget %d", peak, budget)
	}
	// Every consumer still has its lookup and data connections; the one client_closed is the
	// harness's readiness probe.
	closes := pp.MetricsText(`rebatchproxy_closes_total`)
	for _, l := range strings.Split(closes, "\n") {
		if !strings.HasSuffix(l, " 0") && l != `rebatchproxy_closes_total{reason="client_closed"} 1` {
			t.Errorf("the proxy closed connections while the consumers were open: %s", l)
		}
	}
	if open := pp.MetricsText(`rebatchproxy_connections_open{side="client"}`); !strings.HasSuffix(open, fmt.Sprintf(" %d", 2*consumers)) {
		t.Errorf("open client connections: %s; want %d (a lookup and a data connection per consumer)", open, 2*consumers)
	}
}
