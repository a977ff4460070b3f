// Command rebatch measures, in one run, small-message producers (pulsar-client-go, unbatched
// and in client batches of 10) sending directly to a broker and through the proxy under each policy
// (passthrough, coalesce, merged, properties, buckets), and prints messages/s, stored entries/s
// and their ratios to direct side by side, then the broker's and the proxy's CPU per message
// (the proxy is this command re-run as a process of its own, so /proc gives its CPU apart from
// the clients'). It then measures the rebatch engine alone, in process, on one goroutine.
//
//	go run ./e2e/bench/rebatch -broker pulsar://127.0.0.1:16650 -admin http://127.0.0.1:18080
//
// It is a measurement, not a test: it never fails on numbers. It fails only when something
// does not work (a send error, an engine error, a receipt count that does not add up).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	plog "github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/sirupsen/logrus"

	"github.com/rebatchproxy/rebatchproxy/chunkdedup"
	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/proxy"
	"github.com/rebatchproxy/rebatchproxy/rebatch"
	"github.com/rebatchproxy/rebatchproxy/route"
	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// workload is one shape of producer traffic: messages of size bytes, unbatched or in small
// client batches.
type workload struct {
	name      string
	producers int
	sync      bool // one send at a time per producer (wait for each receipt)
	batch     uint // 0: batching off; else the client's BatchingMaxMessages (1 ms delay)
}

// target is where a workload's producers connect.
type target struct {
	name string
	url  string
	ns   string
}

// result is one cell: a workload on a target, over one or more rounds.
type result struct {
	msgs, entries float64 // per second, in the round with the best throughput
	acked, stored int64   // messages acknowledged and entries stored, summed over rounds
	brokerCPU     time.Duration
	proxyCPU      time.Duration // 0 for direct
	calls         int64         // proxy read and write system calls
	latency       []uint32      // each acknowledged message's send-to-receipt time in microseconds, every round
	direct        bool
}

// add folds another round of the same cell into r.
func (r result) add(o result) result {
	if o.msgs > r.msgs {
		r.msgs, r.entries = o.msgs, o.entries
	}
	r.acked += o.acked
	r.stored += o.stored
	r.brokerCPU += o.brokerCPU
	r.proxyCPU += o.proxyCPU
	r.calls += o.calls
	r.latency = append(r.latency, o.latency...)
	r.direct = o.direct
	return r
}

// perMessage is total over the acknowledged messages, or -1 when it does not apply.
func (r result) perMessage(total float64, applies bool) float64 {
	if !applies || r.acked == 0 {
		return -1
	}
	return total / float64(r.acked)
}

// brokerUS is the broker's CPU microseconds per acknowledged message; -1 unknown.
func (r result) brokerUS() float64 {
	return r.perMessage(r.brokerCPU.Seconds()*1e6, brokerCPUKnown())
}

// proxyUS is the proxy's CPU microseconds per acknowledged message; -1 for direct.
func (r result) proxyUS() float64 { return r.perMessage(r.proxyCPU.Seconds()*1e6, !r.direct) }

// proxyCalls is the proxy's read and write system calls per acknowledged message; -1 for direct.
func (r result) proxyCalls() float64 { return r.perMessage(float64(r.calls), !r.direct) }

var (
	brokerURL = flag.String("broker", "pulsar://127.0.0.1:16650", "broker service URL")
	adminURL  = flag.String("admin", "http://127.0.0.1:18080", "broker admin URL (entry counts)")
	duration  = flag.Duration("duration", 3*time.Second, "sending time per workload and target")
	size      = flag.Int("size", 100, "payload bytes")
	maxDelay  = flag.Duration("max-delay", 2*time.Millisecond, "max_delay of the coalesce and properties policies")
	maxMsgs   = flag.Int("max-messages", 0, "max_messages of the coalesce and properties policies (0: the policy default)")
	engineDur = flag.Duration("engine-duration", 2*time.Second, "time per policy for the in-process engine rate (0: skip that section)")
	rounds    = flag.Int("rounds", 1, "runs per cell; each round starts one target later than the last (direct, passthrough, ...; passthrough, ..., direct; ...); a cell's throughput is its best round's, its per-message figures are over all its rounds")
	only      = flag.String("only", "", "run only the workloads whose name contains this (e.g. \"sync x64\")")
	cpuprof   = flag.String("cpuprofile", "", "write the proxy process's CPU profile to this file")
	brokerPID = flag.Int("broker-pid", 0, "pid of the broker's JVM, for its CPU per message (from /proc/PID/stat); 0: read -broker-pid-file")
	pidFile   = flag.String("broker-pid-file", "", "file holding the broker's pid (pulsar.sh keeps it in .pulsar/run/INSTANCE/pulsar.pid); empty: no broker CPU")
	policies  = flag.String("policies", "coalesce,merged,properties,buckets", "the rewriting targets measured besides direct and passthrough, comma-separated (e.g. \"buckets\" to profile one policy with -cpuprofile)")
)

// childEnv, when set, makes this process the proxy of a run (serveChild): its value is the
// run's namespace stamp. The proxy is a process of its own so that its CPU per message can be
// read from /proc, apart from the clients'.
const childEnv = "REBATCH_BENCH_PROXY_STAMP"

func main() {
	flag.Parse()
	if *rounds < 1 {
		fail(fmt.Errorf("-rounds %d: want at least 1", *rounds))
	}
	chosen := chosenPolicies(*policies)
	stamp := time.Now().UnixNano()
	if s := os.Getenv(childEnv); s != "" {
		if _, err := fmt.Sscan(s, &stamp); err != nil {
			fail(err)
		}
	}
	nsOf := func(pol string) string { return fmt.Sprintf("public/rbbench-%s-%d", pol, stamp) }
	if os.Getenv(childEnv) != "" {
		serveChild(nsOf)
		return
	}
	for _, pol := range []string{"direct", "passthrough", "coalesce", "merged", "properties", "buckets"} {
		if err := admin(http.MethodPut, "/admin/v2/namespaces/"+nsOf(pol), nil); err != nil {
			fail(fmt.Errorf("create namespace %s: %w", nsOf(pol), err))
		}
	}
	proxyURL, stop := startChild(stamp)
	defer stop()

	targets := []target{
		{"direct", *brokerURL, nsOf("direct")},
		{"passthrough", proxyURL, nsOf("passthrough")},
		{"coalesce", proxyURL, nsOf("coalesce")},
		{"merged", proxyURL, nsOf("merged")},
		{"properties", proxyURL, nsOf("properties")},
		{"buckets", proxyURL, nsOf("buckets")},
	}
	// Direct and passthrough always run: they are the bases of every ratio.
	targets = slices.DeleteFunc(targets, func(tg target) bool {
		return tg.name != "direct" && tg.name != "passthrough" && !chosen[tg.name]
	})
	wls := []workload{
		{"async x4", 4, false, 0},
		{"async x1", 1, false, 0},
		{"sync x64", 64, true, 0},
		{"sync x16", 16, true, 0},
		{"sync x1", 1, true, 0},
		// Small-batch producers: a legacy client with batching on whose batches stay small.
		// Synchronous ones send batches of one message, each after the client's 1 ms delay.
		{"async x4 b10", 4, false, 10},
		{"async x1 b10", 1, false, 10},
		{"sync x64 b10", 64, true, 10},
	}
	fmt.Printf("broker %s; proxy process %d at %s; %d-byte messages, unbatched (bN: client batches of up to N, 1 ms delay); %v per run, %d rounds per cell, rotating (throughput: the best round; per message: all rounds); GOMAXPROCS %d (clients, proxy and broker share the machine)\n",
		*brokerURL, childPID, proxyURL, *size, *duration, *rounds, runtime.GOMAXPROCS(0))
	fmt.Printf("policies: coalesce, properties and buckets with max_delay %v, max_messages %d (0 = default), defaults otherwise (group commit); merged = coalesce with merge_producers and hold_when_idle; properties restricts region: [us, eu], messages carry region in runs of 50; buckets: 4, its messages (only) keyed k0..k99\n\n", *maxDelay, *maxMsgs)
	fmt.Printf("%-12s | %-21s", "workload", "direct msg/s entr/s")
	for _, tg := range targets[1:] {
		fmt.Printf(" | %-37s", tg.name+" msg/s (x) entr/s (x) msg/entry")
	}
	fmt.Println()
	if *brokerPID == 0 && *pidFile != "" {
		b, err := os.ReadFile(*pidFile)
		if err != nil {
			fail(fmt.Errorf("broker-pid-file: %w", err))
		}
		if _, err := fmt.Sscan(string(b), brokerPID); err != nil {
			fail(fmt.Errorf("broker-pid-file %s: %w", *pidFile, err))
		}
	}
	var ran []workload
	var cpu, pcpu, pcalls [][]float64
	var lat [][][2]float64 // per workload and target: median and 99th percentile, ms
	for _, w := range wls {
		if !strings.Contains(w.name, *only) {
			continue
		}
		res := make([]result, len(targets))
		row := make([]float64, len(targets))
		prow := make([]float64, len(targets))
		crow := make([]float64, len(targets))
		for r := 0; r < *rounds; r++ {
			for j := range targets {
				i := (j + r) % len(targets)
				res[i] = res[i].add(run(targets[i], w))
			}
		}
		lrow := make([][2]float64, len(targets))
		for i := range targets {
			row[i], prow[i], crow[i] = res[i].brokerUS(), res[i].proxyUS(), res[i].proxyCalls()
			lrow[i][0], lrow[i][1] = quantiles(res[i].latency)
			res[i].latency = nil
		}
		lat = append(lat, lrow)
		ran, cpu, pcpu, pcalls = append(ran, w), append(cpu, row), append(pcpu, prow), append(pcalls, crow)
		d := res[0]
		fmt.Printf("%-12s | %8.0f %8.0f   ", w.name, d.msgs, d.entries)
		for _, r := range res[1:] {
			fmt.Printf(" | %8.0f (%5.2fx) %7.0f (%5.2fx) %6.1f  ", r.msgs, r.msgs/d.msgs, r.entries, r.entries/d.entries, float64(r.acked)/float64(r.stored))
		}
		fmt.Println()
	}

	names := make([]string, len(targets))
	for i, tg := range targets {
		names[i] = tg.name
	}
	fmt.Printf("\nsend latency (ms from the client's send to its receipt, every acknowledged message of every round: median / 99th percentile; asynchronous sends include the time they wait in the client's queue):\n")
	fmt.Printf("%-12s", "workload")
	for _, n := range names {
		fmt.Printf(" | %-15s", n)
	}
	fmt.Println()
	for i, w := range ran {
		fmt.Printf("%-12s", w.name)
		for _, q := range lat[i] {
			fmt.Printf(" | %6.2f / %6.2f", q[0], q[1])
		}
		fmt.Println()
	}
	if brokerCPUKnown() {
		fmt.Printf("\nbroker CPU per acknowledged message (us, from /proc/%d/stat over each cell; direct's over the target's = how many times less the broker works per message):\n", *brokerPID)
		printCPUTable(ran, names, cpu, 0, func(base, v float64) float64 { return base / v })
	}
	fmt.Printf("\nproxy CPU per acknowledged message (us, from /proc/%d/stat over each cell; the target's over passthrough's = what the policy costs the proxy):\n", childPID)
	printCPUTable(ran, names, pcpu, 1, func(base, v float64) float64 { return v / base })
	fmt.Printf("\nproxy read and write system calls per acknowledged message (syscr + syscw of /proc/%d/io over each cell; the target's over passthrough's):\n", childPID)
	printCPUTable(ran, names, pcalls, 1, func(base, v float64) float64 { return v / base })

	if *engineDur <= 0 {
		return
	}
	fmt.Printf("\nengine in process (one goroutine, unbatched %d-byte sends, split/merge/receipts):\n", *size)
	for _, k := range []rebatch.Kind{rebatch.Coalesce, rebatch.Properties, rebatch.Buckets} {
		rate, perEntry := engineRate(k)
		fmt.Printf("  %-10s %10.0f messages/s  (%.0f messages/entry)\n", k, rate, perEntry)
	}
}

// printCPUTable prints one row per workload of a per-message figure (CPU microseconds, system calls): the column of
// target base, then each later target's with its ratio to base (ratio(base, value)).
func printCPUTable(ran []workload, names []string, rows [][]float64, base int, ratio func(base, v float64) float64) {
	fmt.Printf("%-12s | %-11s", "workload", names[base])
	for _, n := range names[base+1:] {
		fmt.Printf(" | %-20s", n)
	}
	fmt.Println()
	for i, w := range ran {
		b := rows[i][base]
		fmt.Printf("%-12s | %11.2f", w.name, b)
		for _, v := range rows[i][base+1:] {
			fmt.Printf(" | %8.2f (%5.2fx)   ", v, ratio(b, v))
		}
		fmt.Println()
	}
}

// mergedPolicy is coalesce with merge_producers, holding batches for max_delay: the setting
// for synchronous producers.
func mergedPolicy() rebatch.Policy {
	p := policyFor(rebatch.Coalesce)
	p.MergeProducers, p.HoldWhenIdle = true, true
	return p
}

func policyFor(k rebatch.Kind) rebatch.Policy {
	p := rebatch.Policy{Kind: k, MaxDelay: *maxDelay, MaxMessages: *maxMsgs}
	switch k {
	case rebatch.Properties:
		p.Restricted = map[string][]string{"region": {"us", "eu"}}
	case rebatch.Buckets:
		p.Buckets = 4 // 100 keys over 4 buckets
	}
	return p
}

// childPID is the proxy process's pid (startChild).
var childPID int

// startChild runs this command again as the proxy (childEnv set to stamp, the same flags) and
// returns its URL and a function that stops it.
func startChild(stamp int64) (string, func()) {
	exe, err := os.Executable()
	if err != nil {
		fail(err)
	}
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", childEnv, stamp))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		fail(err)
	}
	if err := cmd.Start(); err != nil {
		fail(err)
	}
	childPID = cmd.Process.Pid
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	a, err := harness.WaitListening(out, exited, 15*time.Second)
	if err != nil {
		_ = cmd.Process.Kill()
		fail(fmt.Errorf("the proxy process: %w", err))
	}
	return a, func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-exited
	}
}

// serveChild is the proxy process: one rule per policy namespace, until SIGTERM. With
// -cpuprofile it profiles itself.
func serveChild(nsOf func(string) string) {
	if *cpuprof != "" {
		f, err := os.Create(*cpuprof)
		if err != nil {
			fail(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fail(err)
		}
		defer pprof.StopCPUProfile()
	}
	url, stop := startProxy(nsOf)
	fmt.Println("listening " + url)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	stop()
}

// startProxy starts the proxy in this process with one rule per policy namespace.
func startProxy(nsOf func(string) string) (string, func()) {
	addr, err := proxy.BrokerAddress(*brokerURL)
	if err != nil {
		fail(err)
	}
	rules := []route.Rule[rebatch.Policy]{
		{Pattern: nsOf("passthrough") + "/*", Policy: rebatch.Policy{Kind: rebatch.Passthrough}},
		{Pattern: nsOf("coalesce") + "/*", Policy: policyFor(rebatch.Coalesce)},
		{Pattern: nsOf("merged") + "/*", Policy: mergedPolicy()},
		{Pattern: nsOf("properties") + "/*", Policy: policyFor(rebatch.Properties)},
		{Pattern: nsOf("buckets") + "/*", Policy: policyFor(rebatch.Buckets)},
	}
	m, err := route.NewMatcher(rules)
	if err != nil {
		fail(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := proxy.DefaultConfig()
	cfg.Listen, cfg.Brokers, cfg.Logger = "127.0.0.1:0", []string{addr}, log
	cfg.ProducerPaths = proxy.RebatchPaths(proxy.NewPolicies(m), proxy.NewRebatchMetrics(), proxy.NewChunkDedup(chunkdedup.Config{}), log)
	srv, err := proxy.New(cfg)
	if err != nil {
		fail(err)
	}
	go func() { _ = srv.Serve() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	la := srv.Addr(ctx)
	if la == "" {
		fail(fmt.Errorf("proxy did not start"))
	}
	return "pulsar://" + la, func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}
}

func region(i int64) string {
	if (i/50)%2 == 0 {
		return "us"
	}
	return "eu"
}

// run sends w on a fresh topic of tg for the configured duration and measures acknowledged
// messages and stored entries per second.
func run(tg target, w workload) result {
	l := logrus.New()
	l.SetLevel(logrus.ErrorLevel)
	c, err := pulsar.NewClient(pulsar.ClientOptions{URL: tg.url, Logger: plog.NewLoggerWithLogrus(l), OperationTimeout: 30 * time.Second})
	if err != nil {
		fail(err)
	}
	defer c.Close()
	topic := fmt.Sprintf("persistent://%s/%s-%d", tg.ns, strings.ReplaceAll(w.name, " ", ""), time.Now().UnixNano())
	payload := make([]byte, *size)
	prods := make([]pulsar.Producer, w.producers)
	for i := range prods {
		opts := pulsar.ProducerOptions{Topic: topic, DisableBatching: true, MaxPendingMessages: 1000}
		if w.batch > 0 {
			opts.DisableBatching = false
			opts.BatchingMaxMessages = w.batch
			opts.BatchingMaxPublishDelay = time.Millisecond
		}
		p, err := c.CreateProducer(opts)
		if err != nil {
			fail(err)
		}
		defer p.Close()
		// Warm-up: the connection and the producer are ready before the clock starts.
		if _, err := p.Send(context.Background(), &pulsar.ProducerMessage{Payload: payload}); err != nil {
			fail(err)
		}
		prods[i] = p
	}
	before := entries(topic)
	cpuBefore, proxyBefore, callsBefore := brokerCPU(), procCPU(childPID), procCalls(childPID)
	var acked, failed atomic.Int64
	var wg sync.WaitGroup
	ctx := context.Background()
	lats := make([]latencies, len(prods))
	start := time.Now()
	end := start.Add(*duration)
	for j, p := range prods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := &lats[j]
			for i := int64(0); time.Now().Before(end); i++ {
				msg := &pulsar.ProducerMessage{Payload: payload, Properties: map[string]string{"region": region(i)}}
				if tg.name == "buckets" {
					msg.Key = keys[i%100] // the others keep keyless messages: split_keys parts keyed ones
				}
				sent := time.Now()
				if w.sync {
					if _, err := p.Send(ctx, msg); err != nil {
						failed.Add(1)
					} else {
						acked.Add(1)
						lat.note(sent)
					}
					continue
				}
				p.SendAsync(ctx, msg, func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
					if err != nil {
						failed.Add(1)
					} else {
						acked.Add(1)
						lat.note(sent)
					}
				})
			}
			if err := p.FlushWithCtx(ctx); err != nil {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	cpuUsed, proxyUsed, calls := brokerCPU()-cpuBefore, procCPU(childPID)-proxyBefore, procCalls(childPID)-callsBefore
	if failed.Load() > 0 {
		fail(fmt.Errorf("%s %s: %d sends failed", tg.name, w.name, failed.Load()))
	}
	n := entries(topic) - before
	r := result{msgs: float64(acked.Load()) / el, entries: float64(n) / el, acked: acked.Load(), stored: n,
		brokerCPU: cpuUsed, direct: tg.name == "direct"}
	for i := range lats {
		lats[i].mu.Lock() // every callback ran before FlushWithCtx returned; the lock says so to -race
		r.latency = append(r.latency, lats[i].us...)
		lats[i].mu.Unlock()
	}
	if !r.direct {
		r.proxyCPU, r.calls = proxyUsed, calls
	}
	return r
}

// latencies collects one producer's send-to-receipt times. Its mutex is for asynchronous
// sends, whose callbacks the client may run on more than one goroutine.
type latencies struct {
	mu sync.Mutex
	us []uint32
}

// note records the time since sent.
func (l *latencies) note(sent time.Time) {
	us := uint32(min(time.Since(sent).Microseconds(), 1<<32-1))
	l.mu.Lock()
	l.us = append(l.us, us)
	l.mu.Unlock()
}

// quantiles sorts us and returns its median and 99th percentile in milliseconds (0, 0 when empty).
func quantiles(us []uint32) (p50, p99 float64) {
	if len(us) == 0 {
		return 0, 0
	}
	slices.Sort(us)
	at := func(q float64) float64 { return float64(us[int(q*float64(len(us)-1))]) / 1000 }
	return at(0.50), at(0.99)
}

// rewritingTargets are the targets -policies chooses from.
var rewritingTargets = []string{"coalesce", "merged", "properties", "buckets"}

// chosenPolicies returns the set of rewriting targets named in list (comma-separated); a name
// that is not one of rewritingTargets fails the run.
func chosenPolicies(list string) map[string]bool {
	want := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		if !slices.Contains(rewritingTargets, n) {
			fail(fmt.Errorf("-policies: no rewriting target %q (%s)", n, strings.Join(rewritingTargets, ", ")))
		}
		want[n] = true
	}
	return want
}

// keys are the buckets target's message keys, k0..k99 (the policy routes on them).
var keys = func() []string {
	k := make([]string, 100)
	for i := range k {
		k[i] = fmt.Sprintf("k%d", i)
	}
	return k
}()

func brokerCPUKnown() bool { return *brokerPID > 0 }

// brokerCPU is the broker process's user plus system CPU time so far (0 when unknown).
func brokerCPU() time.Duration {
	if !brokerCPUKnown() {
		return 0
	}
	return procCPU(*brokerPID)
}

// procCalls is the number of read-like and write-like system calls process pid has made so far
// (syscr + syscw of /proc/PID/io: read, readv, write, writev and their kin; not epoll or futex).
func procCalls(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		fail(fmt.Errorf("system calls of process %d: %w", pid, err))
	}
	var n int64
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && (f[0] == "syscr:" || f[0] == "syscw:") {
			var v int64
			if _, err := fmt.Sscan(f[1], &v); err != nil {
				fail(fmt.Errorf("/proc/%d/io %q: %w", pid, l, err))
			}
			n += v
		}
	}
	return n
}

// procCPU is process pid's user plus system CPU time so far.
func procCPU(pid int) time.Duration {
	d, err := harness.ProcCPU(pid)
	if err != nil {
		fail(fmt.Errorf("CPU time of process %d: %w", pid, err))
	}
	return d
}

// entries returns the number of entries the broker has written for topic.
func entries(topic string) int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := harness.Attach(*brokerURL, *adminURL, "").EntryCount(ctx, topic)
	if err != nil {
		fail(err)
	}
	return n
}

func admin(method, path string, out any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(*adminURL, "/")+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, body)
	}
	if out != nil {
		return json.Unmarshal(body, out)
	}
	return nil
}

// engineRate runs the engine alone on unbatched single-message SEND frames as
// pulsar-client-go makes them with batching off, acknowledges every entry it builds and
// counts the client receipts it releases. It returns messages per second and messages per
// entry.
func engineRate(k rebatch.Kind) (float64, float64) {
	const perRound = 10000
	payload := make([]byte, *size)
	frames := make([][]byte, perRound)
	now := uint64(time.Now().UnixMilli())
	for i := range frames {
		seq := uint64(i)
		md := &pulsarpb.MessageMetadata{ProducerName: ptr("bench"), SequenceId: &seq, PublishTime: &now,
			Properties: []*pulsarpb.KeyValue{{Key: ptr("region"), Value: ptr(region(int64(i)))}}}
		if k == rebatch.Buckets {
			md.PartitionKey = ptr(fmt.Sprintf("k%d", i%100))
		}
		f, err := wire.AppendSendFrameMetadata(nil, &wire.Send{ProducerID: 1, SequenceID: seq}, md, payload)
		if err != nil {
			fail(err)
		}
		frames[i] = f
	}
	var out rebatch.Output
	var spare []byte
	var msgs, built int64
	clock := time.Now()
	start := time.Now()
	for time.Since(start) < *engineDur {
		// Batches held until full or timed out: the engine's merging work, not the group
		// commit's one-message entries (which depend on broker latency, absent here).
		pol := policyFor(k)
		pol.HoldWhenIdle = true
		p, err := rebatch.NewProducer(rebatch.Config{Policy: pol, ProducerID: 1, ProducerName: "bench", LastSequenceID: -1})
		if err != nil {
			fail(err)
		}
		if k == rebatch.Buckets {
			// One broker producer per bucket, opened as the proxy opens them (PRODUCER, then
			// PRODUCER_SUCCESS for each).
			next := uint64(1000)
			if err := p.OpenLanes("persistent://public/default/bench", nil, func() uint64 { next++; return next }, &out); err != nil {
				fail(err)
			}
			for b := out.Broker; len(b) > 0; {
				f, n, err := wire.ReadFrame(b, 5<<20)
				if err != nil {
					fail(err)
				}
				b = b[n:]
				var cmd pulsarpb.BaseCommand
				if err := wire.DecodeCommand(f, &cmd); err != nil {
					fail(err)
				}
				p.LaneOpened(cmd.GetProducer().GetRequestId(), -1)
			}
			out.Broker = out.Broker[:0]
		}
		receipts := 0
		ledgerEntry := uint64(0)
		ack := func() {
			// Acknowledge every entry written so far, in order, as the broker would.
			b := out.Broker
			out.Broker = spare[:0]
			for len(b) > 0 {
				f, n, err := wire.ReadFrame(b, 5<<20)
				if err != nil {
					fail(err)
				}
				b = b[n:]
				s, err := wire.ParseSend(f)
				if err != nil {
					fail(err)
				}
				built++
				ledgerEntry++
				if err := p.Receipt(wire.SendReceipt{ProducerID: s.ProducerID, SequenceID: s.SequenceID, HighestSequenceID: s.HighestSequenceID,
					HasMessageID: true, LedgerID: 1, EntryID: ledgerEntry}, &out); err != nil {
					fail(err)
				}
			}
			if len(out.Broker) > 0 {
				fail(fmt.Errorf("engine %s: a receipt made the engine send to the broker", k))
			}
			spare = out.Broker
			receipts += countFrames(out.Client)
			out.Client = out.Client[:0]
		}
		for _, fb := range frames {
			f, _, err := wire.ReadFrame(fb, 5<<20)
			if err != nil {
				fail(err)
			}
			if err := p.Send(clock, f, &out); err != nil {
				fail(err)
			}
			if len(out.Broker) > 0 {
				ack()
			}
		}
		if err := p.Flush(&out); err != nil {
			fail(err)
		}
		ack()
		if receipts != perRound || p.Pending() != 0 {
			fail(fmt.Errorf("engine %s: %d receipts for %d sends, %d pending", k, receipts, perRound, p.Pending()))
		}
		msgs += perRound
	}
	return float64(msgs) / time.Since(start).Seconds(), float64(msgs) / float64(built)
}

func countFrames(b []byte) int {
	n := 0
	for len(b) > 0 {
		_, m, err := wire.ReadFrame(b, 5<<20)
		if err != nil {
			fail(err)
		}
		b = b[m:]
		n++
	}
	return n
}

func ptr[T any](v T) *T { return &v }

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}
