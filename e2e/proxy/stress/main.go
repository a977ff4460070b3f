// Command stress prints the proxy's peak RSS against its memory budget under three loads, each
// on a fresh proxy process in front of a real broker: idle connections, active producers, and
// consumers that stop reading their sockets while the broker has messages for them. It is a
// measurement, not a test: it fails only when a load cannot be run (or the proxy closes
// connections it should have slowed). See README.md.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	plog "github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/e2e/faultrelay"
	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

func main() {
	brokerURL := flag.String("broker", "pulsar://127.0.0.1:16650", "broker service URL")
	idle := flag.Int("idle", 5000, "idle connections (each also opens a broker connection)")
	producers := flag.Int("producers", 1000, "active producers (20 per client connection)")
	produceFor := flag.Duration("produce-for", 10*time.Second, "how long the producers send")
	stalled := flag.Int("stalled", 16, "consumers that stop reading (one connection each)")
	stalledMB := flag.Int("stalled-mb", 200, "megabytes produced while they do not read")
	budget := flag.String("memory-budget", "256MiB", "the proxy's --memory-budget")
	flag.StringVar(&heapDir, "heap-profiles", "", "directory to write the proxy's heap profiles to (stalled load: when the consumers resume and 3 s later)")
	flag.Parse()

	bin, err := buildProxy()
	if err != nil {
		log.Fatal(err)
	}
	budgetBytes, err := parseMiB(*budget)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("proxy --memory-budget %s (%d MiB); broker %s\n\n", *budget, budgetBytes>>20, *brokerURL)
	fmt.Printf("%-34s %10s %14s %14s %s\n", "load", "peak RSS", "budget", "held (peak)", "closed by the proxy")
	loads := []struct {
		name string
		run  func(px *proc) error
	}{
		{fmt.Sprintf("%d idle connections", *idle), func(px *proc) error { return idleConns(px, *idle) }},
		{fmt.Sprintf("%d active producers", *producers), func(px *proc) error { return activeProducers(px, *producers, *produceFor) }},
		{fmt.Sprintf("%d stalled consumers, %d MB", *stalled, *stalledMB), func(px *proc) error {
			return stalledConsumers(px, *brokerURL, *stalled, *stalledMB)
		}},
	}
	failed := false
	for _, l := range loads {
		px, err := startProxy(bin, *brokerURL, *budget)
		if err != nil {
			log.Fatal(err)
		}
		stop := px.sampleHeld()
		runErr := l.run(px)
		heldPeak := stop()
		peak, _ := harness.PeakRSS(px.cmd.Process.Pid)
		closes := px.errorCloses()
		px.stop()
		fmt.Printf("%-34s %7.0f MiB %10d MiB %10.1f MiB %s\n", l.name, float64(peak)/(1<<20), budgetBytes>>20, heldPeak/(1<<20), closes)
		if runErr != nil {
			fmt.Printf("  load failed: %v\n", runErr)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}

func parseMiB(s string) (int64, error) {
	n, err := strconv.ParseInt(strings.TrimSuffix(s, "MiB"), 10, 64)
	if err != nil || !strings.HasSuffix(s, "MiB") {
		return 0, fmt.Errorf("-memory-budget %q: give it in MiB, e.g. 256MiB", s)
	}
	return n << 20, nil
}

// buildProxy builds ./cmd/proxy of this repository into a temporary directory.
func buildProxy() (string, error) {
	dir, err := os.MkdirTemp("", "stress-proxy-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "proxy")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/proxy")
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build ./cmd/proxy (run this from the repository root): %w", err)
	}
	return bin, nil
}

// proc is a proxy process.
type proc struct {
	cmd     *exec.Cmd
	addr    string
	metrics string
}

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func startProxy(bin, brokerURL, budget string) (*proc, error) {
	p := &proc{addr: freeAddr(), metrics: freeAddr()}
	p.cmd = exec.Command(bin, "--listen", p.addr, "--broker-url", brokerURL, "--metrics-listen", p.metrics,
		"--memory-budget", budget, "--log-level", "warn", "--pprof")
	p.cmd.Stdout, p.cmd.Stderr = os.Stderr, os.Stderr
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if resp, err := http.Get("http://" + p.metrics + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, nil
			}
		}
	}
	p.stop()
	return nil, errors.New("proxy not ready within 15 s")
}

func (p *proc) stop() {
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}

func (p *proc) url() string { return "pulsar://" + p.addr }

// heapDir, when set, receives heap profiles (heapProfile).
var heapDir string

// heapProfile writes the proxy's heap profile to heapDir/name.pb.gz, if heapDir is set.
func (p *proc) heapProfile(name string) {
	if heapDir == "" {
		return
	}
	resp, err := http.Get("http://" + p.metrics + "/debug/pprof/heap")
	if err != nil {
		log.Printf("heap profile %s: %v", name, err)
		return
	}
	defer resp.Body.Close()
	f, err := os.Create(filepath.Join(heapDir, name+".pb.gz"))
	if err != nil {
		log.Printf("heap profile %s: %v", name, err)
		return
	}
	defer f.Close()
	_, _ = f.ReadFrom(resp.Body)
}

// metric returns the value of the first /metrics line starting with prefix.
func (p *proc) metric(prefix string) (float64, bool) {
	resp, err := http.Get("http://" + p.metrics + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, prefix+" ") {
			v, err := strconv.ParseFloat(strings.TrimPrefix(l, prefix+" "), 64)
			return v, err == nil
		}
	}
	return 0, false
}

// sampleHeld samples rebatchproxy_buffered_bytes every 100 ms until the returned func is called,
// which returns the peak.
func (p *proc) sampleHeld() func() float64 {
	done := make(chan struct{})
	var peak float64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if v, ok := p.metric("rebatchproxy_buffered_bytes"); ok {
					peak = max(peak, v)
				}
			}
		}
	}()
	return func() float64 { close(done); wg.Wait(); return peak }
}

// errorCloses lists the proxy's non-zero close counters other than the clients' own closes.
func (p *proc) errorCloses() string {
	resp, err := http.Get("http://" + p.metrics + "/metrics")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "rebatchproxy_closes_total{") && !strings.HasSuffix(l, " 0") &&
			!strings.Contains(l, `"client_closed"`) && !strings.Contains(l, `"broker_closed"`) {
			out = append(out, strings.TrimPrefix(l, "rebatchproxy_closes_total"))
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, " ")
}

// idleConns opens n raw protocol connections through the proxy (CONNECT answered by the
// broker's CONNECTED), holds them 5 s and closes them.
func idleConns(px *proc, n int) error {
	connect, err := wire.AppendCommandFrame(nil, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_CONNECT.Enum(),
		Connect: &pulsarpb.CommandConnect{ClientVersion: proto.String("stress"), ProtocolVersion: proto.Int32(20)}})
	if err != nil {
		return err
	}
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	buf := make([]byte, 64<<10)
	for i := 0; i < n; i++ {
		c, err := net.DialTimeout("tcp", px.addr, 5*time.Second)
		if err != nil {
			return fmt.Errorf("connection %d: %w", i, err)
		}
		conns = append(conns, c)
		if _, err := c.Write(connect); err != nil {
			return fmt.Errorf("connection %d: %w", i, err)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		k, err := c.Read(buf)
		if err != nil {
			return fmt.Errorf("connection %d: no CONNECTED: %w", i, err)
		}
		if t, ok := frameType(buf[:k]); !ok || t != pulsarpb.BaseCommand_CONNECTED {
			return fmt.Errorf("connection %d: answered %v, not CONNECTED", i, t)
		}
	}
	time.Sleep(5 * time.Second)
	return nil
}

func frameType(b []byte) (pulsarpb.BaseCommand_Type, bool) {
	f, _, err := wire.ReadFrame(b, 5<<20)
	if err != nil {
		return 0, false
	}
	return f.Type(), true
}

func quietLogger() plog.Logger { return harness.ClientLogger(logrus.ErrorLevel) }

// activeProducers runs n producers (20 per client connection, over 50 topics) each sending 1 KB
// messages synchronously (one in flight) for d, and checks every send was acknowledged. (Each
// producer with a window of its own on a topic of its own takes the standalone broker past its
// direct memory.)
func activeProducers(px *proc, n int, d time.Duration) error {
	const perClient = 20
	run := fmt.Sprint(time.Now().UnixNano())
	var sent, failed atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	payload := make([]byte, 1024)
	for c := 0; c*perClient < n; c++ {
		client, err := pulsar.NewClient(pulsar.ClientOptions{URL: px.url(), Logger: quietLogger(), OperationTimeout: 60 * time.Second})
		if err != nil {
			return err
		}
		defer client.Close()
		for i := c * perClient; i < min(n, (c+1)*perClient); i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p, err := client.CreateProducer(pulsar.ProducerOptions{
					Topic: fmt.Sprintf("persistent://public/default/stress-%s-%d", run, i%50), SendTimeout: time.Minute,
					DisableBatching: true})
				if err != nil {
					errs <- err
					return
				}
				defer p.Close()
				for end := time.Now().Add(d); time.Now().Before(end); {
					sent.Add(1)
					if _, err := p.Send(context.Background(), &pulsar.ProducerMessage{Payload: payload}); err != nil {
						failed.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	fmt.Printf("  (%d messages sent, %d failed)\n", sent.Load(), failed.Load())
	if failed.Load() > 0 {
		return fmt.Errorf("%d sends failed", failed.Load())
	}
	return nil
}

// stalledConsumers subscribes n consumers (receiver queues of 100,000) through a relay that
// then stops passing bytes towards them, produces mb megabytes of 100 KB messages directly to
// the broker, resumes the relay and checks every consumer receives every message.
func stalledConsumers(px *proc, brokerURL string, n, mb int) error {
	relay, err := faultrelay.Start(faultrelay.Config{Upstream: px.addr})
	if err != nil {
		return err
	}
	defer relay.Close()
	topic := fmt.Sprintf("persistent://public/default/stress-stalled-%d", time.Now().UnixNano())
	var consumers []pulsar.Consumer
	for i := 0; i < n; i++ {
		c, err := pulsar.NewClient(pulsar.ClientOptions{URL: relay.URL(), Logger: quietLogger()})
		if err != nil {
			return err
		}
		defer c.Close()
		sub, err := c.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: fmt.Sprintf("s%d", i), ReceiverQueueSize: 100000})
		if err != nil {
			return err
		}
		defer sub.Close()
		consumers = append(consumers, sub)
	}
	relay.HoldToClient()
	released := false
	defer func() {
		if !released {
			relay.ReleaseToClient()
		}
	}()
	msgs := mb * 10
	pc, err := pulsar.NewClient(pulsar.ClientOptions{URL: brokerURL, Logger: quietLogger()})
	if err != nil {
		return err
	}
	defer pc.Close()
	prod, err := pc.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true, MaxPendingMessages: 100})
	if err != nil {
		return err
	}
	payload := make([]byte, 100<<10)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := 0; i < msgs; i++ {
		wg.Add(1)
		prod.SendAsync(context.Background(), &pulsar.ProducerMessage{Payload: payload}, func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
			if err != nil {
				failed.Add(1)
			}
			wg.Done()
		})
	}
	wg.Wait()
	prod.Close()
	if failed.Load() > 0 {
		return fmt.Errorf("%d sends failed", failed.Load())
	}
	time.Sleep(5 * time.Second) // the broker pushes what the permits allow
	px.heapProfile("stalled")
	relay.ReleaseToClient()
	released = true
	time.AfterFunc(3*time.Second, func() { px.heapProfile("draining") })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var rwg sync.WaitGroup
	short := make(chan string, n)
	for i, c := range consumers {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			got := 0
			for got < msgs {
				m, err := c.Receive(ctx)
				if err != nil {
					short <- fmt.Sprintf("consumer %d got %d of %d: %v", i, got, msgs, err)
					return
				}
				_ = c.Ack(m)
				got++
			}
		}()
	}
	rwg.Wait()
	close(short)
	var problems []string
	for s := range short {
		problems = append(problems, s)
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}
