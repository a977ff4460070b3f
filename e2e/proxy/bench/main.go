// Command bench measures, in one run, the same pulsar-client-go workloads
// sent directly to a broker and through this proxy (started in-process),
// and prints throughput, publish latency and their ratios side by side.
//
//	go run ./e2e/proxy/bench -broker pulsar://127.0.0.1:16650
//
// It is a measurement, not a test: it never fails on numbers.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	plog "github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/sirupsen/logrus"

	"github.com/rebatchproxy/rebatchproxy/proxy"
)

type workload struct {
	name     string
	size     int
	batching bool
	n        int
	sync     bool // one send at a time: latency without queueing
}

type result struct {
	msgs, mbps float64
	p50, p99   time.Duration
}

func main() {
	brokerURL := flag.String("broker", "pulsar://127.0.0.1:16650", "broker service URL")
	scale := flag.Float64("scale", 0.5, "multiply message counts")
	flag.Parse()
	addr, err := proxy.BrokerAddress(*brokerURL)
	if err != nil {
		fail(err)
	}
	cfg := proxy.DefaultConfig()
	cfg.Listen, cfg.Brokers = "127.0.0.1:0", []string{addr}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := proxy.New(cfg)
	if err != nil {
		fail(err)
	}
	go func() { _ = srv.Serve() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	proxyURL := "pulsar://" + srv.Addr(ctx)
	cancel()

	wls := []workload{
		{"100 B batched", 100, true, 200000, false},
		{"100 B unbatched", 100, false, 20000, false},
		{"10 KB batched", 10 << 10, true, 20000, false},
		{"100 B sync (latency)", 100, false, 2000, true},
	}
	fmt.Printf("broker %s, proxy %s (in-process, gnet), GOMAXPROCS shared with the clients\n\n", *brokerURL, proxyURL)
	fmt.Printf("%-22s | %-29s | %-29s | %-22s\n", "workload", "direct msg/s  MB/s  p50  p99", "proxy msg/s  MB/s  p50  p99", "ratio thr, +p50")
	for _, w := range wls {
		w.n = int(float64(w.n) * *scale)
		// Interleave direct and proxy runs and keep the better of each,
		// so warm-up and neighbours' load hit both columns alike.
		d, p := run(*brokerURL, w), run(proxyURL, w)
		d, p = best(d, run(*brokerURL, w)), best(run(proxyURL, w), p)
		fmt.Printf("%-22s | %8.0f %6.1f %6s %6s | %8.0f %6.1f %6s %6s | %.2fx, %+.2f ms\n", w.name,
			d.msgs, d.mbps, ms(d.p50), ms(d.p99), p.msgs, p.mbps, ms(p.p50), ms(p.p99),
			p.msgs/d.msgs, float64(p.p50-d.p50)/1e6)
	}
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
}

// best keeps the higher throughput and the lower latencies of two runs.
func best(a, b result) result {
	if b.msgs > a.msgs {
		a.msgs, a.mbps = b.msgs, b.mbps
	}
	a.p50, a.p99 = min(a.p50, b.p50), min(a.p99, b.p99)
	return a
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/1e6) }

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

// run sends w.n messages to a fresh topic through url and measures them.
func run(url string, w workload) result {
	l := logrus.New()
	l.SetLevel(logrus.ErrorLevel)
	c, err := pulsar.NewClient(pulsar.ClientOptions{URL: url, Logger: plog.NewLoggerWithLogrus(l), OperationTimeout: 30 * time.Second})
	if err != nil {
		fail(err)
	}
	defer c.Close()
	topic := fmt.Sprintf("persistent://public/default/bench-%d", time.Now().UnixNano())
	p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: !w.batching,
		BatchingMaxPublishDelay: time.Millisecond, MaxPendingMessages: 2000, BatchingMaxSize: 128 << 10})
	if err != nil {
		fail(err)
	}
	defer p.Close()
	payload := make([]byte, w.size)
	ctx := context.Background()
	// Warm up the connection and topic.
	for i := 0; i < 50; i++ {
		if _, err := p.Send(ctx, &pulsar.ProducerMessage{Payload: payload}); err != nil {
			fail(err)
		}
	}
	lat := make([]time.Duration, w.n)
	start := time.Now()
	if w.sync {
		for i := 0; i < w.n; i++ {
			t0 := time.Now()
			if _, err := p.Send(ctx, &pulsar.ProducerMessage{Payload: payload}); err != nil {
				fail(err)
			}
			lat[i] = time.Since(t0)
		}
	} else {
		var wg sync.WaitGroup
		wg.Add(w.n)
		for i := 0; i < w.n; i++ {
			t0 := time.Now()
			i := i
			p.SendAsync(ctx, &pulsar.ProducerMessage{Payload: payload}, func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
				if err != nil {
					fail(err)
				}
				lat[i] = time.Since(t0)
				wg.Done()
			})
		}
		wg.Wait()
	}
	el := time.Since(start)
	slices.Sort(lat)
	return result{
		msgs: float64(w.n) / el.Seconds(),
		mbps: float64(w.n*w.size) / el.Seconds() / 1e6,
		p50:  lat[len(lat)/2],
		p99:  lat[len(lat)*99/100],
	}
}
