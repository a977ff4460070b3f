// Command bench measures, in one run, the same pulsar-client-go workloads sent directly to a
// broker, through this proxy and through Apache Pulsar's own Java proxy (from the same
// distribution as the broker), and prints throughput, publish latency, the CPU each proxy
// process used and the ratios side by side.
//
//	go run ./e2e/proxy/bench -broker pulsar://127.0.0.1:16650 -broker-web http://127.0.0.1:18080
//
// Both proxies run as separate processes so that their CPU time can be read from
// /proc/<pid>/stat (utime+stime, all threads): ours is this binary re-executed in proxy mode,
// the Java one is `bin/pulsar proxy` with a generated configuration, small heap. The bench
// starts and stops both itself, with bounded waits. It is a measurement, not a test: it never
// fails on numbers.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	plog "github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/sirupsen/logrus"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
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
	n          int
	elapsed    time.Duration
	cpu        time.Duration // CPU time of the proxy process during the run (0 for direct)
	sysCPU     time.Duration // the part of cpu spent in the kernel (system time)
	clientCPU  time.Duration // CPU time of this process (the client) during the run
	brokerCPU  time.Duration // CPU time of the broker process (with -broker-pid)
	// machineBusy is the busy time of all the machine's cores during the sends (elapsed):
	// every process's, the bench's, the broker's and the proxies' included (harness.MachineCPU).
	machineBusy time.Duration
}

// target is where the client connects: the broker itself or a proxy process.
type target struct {
	name string
	url  string
	pid  int // the proxy process, 0 for direct
}

const childEnv = "REBATCHPROXY_BENCH_CHILD" // set: this process is our proxy, serving the broker named in it

func main() {
	if b := os.Getenv(childEnv); b != "" {
		serveChild(b)
		return
	}
	brokerURL := flag.String("broker", "pulsar://127.0.0.1:16650", "broker service URL")
	brokerWeb := flag.String("broker-web", "http://127.0.0.1:18080", "broker web service URL (for the Java proxy)")
	pulsarHome := flag.String("pulsar-home", "", "Apache Pulsar distribution holding bin/pulsar (default: <repo>/.pulsar/dist/apache-pulsar-4.0.8)")
	java := flag.Bool("java", true, "also measure Pulsar's own Java proxy")
	scale := flag.Float64("scale", 1, "multiply message counts")
	rounds := flag.Int("rounds", 0, "interleaved runs per workload and target, each round starting one target later; the best throughput and latency are kept, CPU is summed (0: one per target, so each takes every position once)")
	only := flag.String("only", "", "run only workloads whose name contains this")
	cpuprofile := flag.String("proxy-cpuprofile", "", "write our proxy's CPU profile (whole run) to this file")
	flag.IntVar(&brokerPID, "broker-pid", 0, "the broker's pid, to report its CPU time per run too (0: not reported)")
	flag.Var(&oursEnv, "proxy-env", "`KEY=VALUE` added to our proxy's environment (not the baseline's), e.g. GOMAXPROCS=1; repeatable")
	readBuf := flag.Int("proxy-read-buffer", 0, "our proxy's ReadBufferCap in bytes (0: its default)")
	baseline := flag.String("baseline", "", "another build of this command (say, of the previous commit) whose proxy is measured too, as target \"base\", to compare a change within one run")
	pin := flag.Bool("pin", false, "the broker and this client on the first CPU, the proxies on the second, for every target (a proxy on a core of its own, as on a host of its own; needs two CPUs and -broker-pid or -tls)")
	tlsMode := flag.Bool("tls", false, "TLS on every hop: start a private broker with a TLS port (certificates made now), connect directly over TLS, and run both proxies with a TLS listener speaking TLS to the broker (-broker and -broker-web are then ignored)")
	flag.Parse()
	if *tlsMode {
		b, err := startTLSBroker()
		if err != nil {
			fail(fmt.Errorf("TLS broker: %w", err))
		}
		defer func() { _ = b.Stop() }()
		brokerPlainURL = b.ServiceURL // the Java proxy's brokerServiceURL must be pulsar://
		*brokerURL, *brokerWeb = b.ServiceURLTLS, b.AdminURL
	}

	addr, err := proxy.BrokerAddress(*brokerURL) // plaintext or TLS: the proxies are told which
	if err != nil {
		fail(err)
	}
	if *pin {
		if err := pinStart(brokerPID); err != nil {
			fail(err)
		}
		defer unpinBroker(brokerPID)
		sig := make(chan os.Signal, 1)
		// SIGPIPE too: output piped into `head` would otherwise kill the bench with the broker
		// still pinned (seen).
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGPIPE)
		go func() { fail(fmt.Errorf("%v: stopped", <-sig)) }() // fail gives the broker its mask back
	}
	targets := []target{{name: "direct", url: *brokerURL}}
	self, err := os.Executable()
	if err != nil {
		fail(err)
	}
	ours, err := startOurs(self, "ours", addr, *cpuprofile, *readBuf, oursEnv...)
	if err != nil {
		fail(fmt.Errorf("our proxy: %w", err))
	}
	defer ours.stop()
	targets = append(targets, ours.target)
	if *java {
		home := *pulsarHome
		if home == "" {
			home = filepath.Join(harness.RepoRoot(), ".pulsar", "dist", "apache-pulsar-4.0.8")
		}
		jp, err := startJava(home, *brokerURL, *brokerWeb, addr)
		if err != nil {
			ours.stop()
			fail(fmt.Errorf("the Java proxy: %w", err))
		}
		defer jp.stop()
		targets = append(targets, jp.target)
	}
	if *baseline != "" {
		bp, err := startOurs(*baseline, "base", addr, "", *readBuf)
		if err != nil {
			fail(fmt.Errorf("the baseline proxy: %w", err))
		}
		defer bp.stop()
		targets = append(targets, bp.target)
	}

	wls := []workload{
		{"100 B batched", 100, true, 200000, false},
		{"100 B unbatched", 100, false, 20000, false},
		{"10 KB batched", 10 << 10, true, 20000, false},
		{"100 B sync (latency)", 100, false, 2000, true},
	}
	for _, t := range targets[1:] {
		proxyPIDs = append(proxyPIDs, t.pid)
	}
	if err := pinAgain(brokerPID, proxyPIDs); err != nil {
		fail(err)
	}
	if *rounds <= 0 {
		*rounds = len(targets)
	}
	mode := "plaintext"
	if tlsFiles != nil {
		mode = "TLS on every hop"
	}
	fmt.Printf("broker %s (%s); GOMAXPROCS %d; %d rounds per cell, interleaved, rotating%s\n", *brokerURL, mode, runtime.GOMAXPROCS(0), *rounds, pinDescription())
	for _, t := range targets[1:] {
		fmt.Printf("  %-6s %s (pid %d)\n", t.name, t.url, t.pid)
	}
	// Warm up: every workload once at a tenth of its size through every target, unmeasured
	// (JIT compilation of the Java proxy, connection pools, topic creation paths).
	for _, w := range wls {
		if *only != "" && !strings.Contains(w.name, *only) {
			continue
		}
		w.n = max(100, int(float64(w.n)**scale/10))
		for _, t := range targets {
			run(t.url, w)
		}
	}
	for _, t := range targets[1:] {
		fmt.Printf("  %-6s idle CPU after warm-up: %.2fs over 2 s\n", t.name, idleCPU(t.pid).Seconds())
	}
	fmt.Println()
	all := map[string][]result{}
	for _, w := range wls {
		if *only != "" && !strings.Contains(w.name, *only) {
			continue
		}
		w.n = max(100, int(float64(w.n)**scale))
		res := make([]result, len(targets))
		for r := 0; r < *rounds; r++ {
			// Each round starts one target later: the run right after another target's pays for
			// the broker's clean-up of it (measured: the second slot lost ~10 % on 100 B
			// unbatched whichever proxy build sat in it), so every target takes every slot.
			for k := range targets {
				i := (k + r) % len(targets)
				x := measure(targets[i], w)
				res[i] = combine(res[i], x, r == 0)
			}
		}
		all[w.name] = res
		printRow(w, targets, res)
	}
	printSummary(targets, wls, all)
}

// combine keeps the higher throughput and the lower latencies of the rounds, and sums messages
// and proxy CPU over all of them.
func combine(acc, x result, first bool) result {
	if first {
		return x
	}
	out := acc
	if x.msgs > out.msgs {
		out.msgs, out.mbps = x.msgs, x.mbps
	}
	out.p50, out.p99 = min(out.p50, x.p50), min(out.p99, x.p99)
	out.n += x.n
	out.elapsed += x.elapsed
	out.cpu += x.cpu
	out.sysCPU += x.sysCPU
	out.clientCPU += x.clientCPU
	out.brokerCPU += x.brokerCPU
	out.machineBusy += x.machineBusy
	return out
}

var brokerPID int

// proxyPIDs are the proxies' processes (for -pin).
var proxyPIDs []int

func measure(t target, w workload) result {
	if err := pinAgain(brokerPID, proxyPIDs); err != nil {
		fail(err)
	}
	user0, sys0 := procCPUSplit(t.pid)
	cl, br := selfCPU(), procCPU(brokerPID)
	r := run(t.url, w)
	user1, sys1 := procCPUSplit(t.pid)
	r.cpu, r.sysCPU = user1+sys1-user0-sys0, sys1-sys0
	r.clientCPU = selfCPU() - cl
	r.brokerCPU = procCPU(brokerPID) - br
	return r
}

// selfCPU is this process's user+system CPU time (the client side of the bench).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		fail(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func printRow(w workload, targets []target, res []result) {
	fmt.Printf("%s (%d messages per run)\n", w.name, w.n)
	fmt.Printf("  %-7s %10s %8s %8s %8s %10s %12s %9s %9s   %-51s %s\n", "target", "msg/s", "MB/s", "p50 ms", "p99 ms", "proxy CPU", "msg/CPU-s", "thr/dir", "+p50 ms",
		"CPU ms per 1000 msgs: proxy (kernel) client broker", "machine: busy, CPU ms per 1000 msgs, ceiling")
	d := res[0]
	for i, t := range targets {
		r := res[i]
		cpu, per := "-", "-"
		if t.pid != 0 {
			cpu = fmt.Sprintf("%.2fs", r.cpu.Seconds())
			if r.cpu > 0 {
				per = fmt.Sprintf("%.0f", float64(r.n)/r.cpu.Seconds())
			}
		}
		per1k := func(c time.Duration) string {
			if c == 0 {
				return "-"
			}
			return fmt.Sprintf("%.1f", c.Seconds()*1e6/float64(r.n))
		}
		proxy := per1k(r.cpu)
		if r.cpu > 0 {
			proxy += " (" + per1k(r.sysCPU) + ")"
		}
		fmt.Printf("  %-7s %10.0f %8.1f %8s %8s %10s %12s %8.2fx %+9.2f   %-51s %s\n", t.name, r.msgs, r.mbps, ms(r.p50), ms(r.p99),
			cpu, per, r.msgs/d.msgs, float64(r.p50-d.p50)/1e6, proxy+" "+per1k(r.clientCPU)+" "+per1k(r.brokerCPU), machineColumns(r, d))
	}
	fmt.Println()
}

// machineColumns gives r's machine figures: how busy all cores were during its sends, their
// busy time per 1000 messages, and the ceiling, direct's busy time per message over r's: the
// throughput over direct that r would reach if both kept the machine saturated. When both run
// near 100 % busy, a throughput under the ceiling is time lost waiting, and the ceiling itself is
// what the CPU the target adds (the proxy's, and whatever it makes the others spend) leaves.
func machineColumns(r, d result) string {
	if r.elapsed <= 0 || r.n == 0 || machineCores == 0 {
		return "-"
	}
	busy := float64(r.machineBusy) / float64(r.elapsed) / float64(machineCores)
	per1k := r.machineBusy.Seconds() * 1e6 / float64(r.n)
	ceiling := "-"
	if r.machineBusy > 0 && d.machineBusy > 0 {
		ceiling = fmt.Sprintf("%.2fx", (float64(d.machineBusy)/float64(d.n))/(float64(r.machineBusy)/float64(r.n)))
	}
	return fmt.Sprintf("%3.0f%% %.1f %s", busy*100, per1k, ceiling)
}

func printSummary(targets []target, wls []workload, all map[string][]result) {
	oi, ji := -1, -1
	for i, t := range targets {
		switch t.name {
		case "ours":
			oi = i
		case "java":
			ji = i
		}
	}
	if oi < 0 || ji < 0 {
		return
	}
	fmt.Println("ours vs Java proxy")
	fmt.Printf("  %-22s %12s %16s %14s\n", "workload", "throughput", "msgs per CPU-s", "+p50 ms")
	for _, w := range wls {
		res, ok := all[w.name]
		if !ok {
			continue
		}
		o, j := res[oi], res[ji]
		per := "-"
		if o.cpu > 0 && j.cpu > 0 {
			per = fmt.Sprintf("%.2fx", (float64(o.n)/o.cpu.Seconds())/(float64(j.n)/j.cpu.Seconds()))
		}
		fmt.Printf("  %-22s %11.2fx %16s %+7.2f/%+.2f\n", w.name, o.msgs/j.msgs, per,
			float64(o.p50-res[0].p50)/1e6, float64(j.p50-res[0].p50)/1e6)
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/1e6) }

var (
	runningMu sync.Mutex
	running   []*process // proxies to stop if the bench fails
)

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	if os.Getenv(childEnv) == "" {
		runningMu.Lock()
		ps := running
		runningMu.Unlock()
		for _, p := range ps {
			p.stop()
		}
		unpinBroker(brokerPID)
		if tlsBroker != nil {
			_ = tlsBroker.Stop()
		}
	}
	os.Exit(1)
}

// run sends w.n messages to a fresh topic through url and measures them.
func run(url string, w workload) result {
	l := logrus.New()
	l.SetLevel(logrus.ErrorLevel)
	opts := pulsar.ClientOptions{URL: url, Logger: plog.NewLoggerWithLogrus(l), OperationTimeout: 30 * time.Second}
	if tlsFiles != nil {
		opts.TLSTrustCertsFilePath, opts.TLSValidateHostname = tlsFiles.CA, true
	}
	c, err := pulsar.NewClient(opts)
	if err != nil {
		fail(err)
	}
	defer c.Close()
	topic := fmt.Sprintf("persistent://public/default/bench-%d", time.Now().UnixNano())
	p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: !w.batching,
		BatchingMaxPublishDelay: time.Millisecond, MaxPendingMessages: 2000, BatchingMaxSize: 128 << 10})
	if err != nil {
		fail(fmt.Errorf("%s: %w", url, err))
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
	busy0 := machineCPU()
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
	busy := machineCPU() - busy0
	slices.Sort(lat)
	return result{
		msgs:        float64(w.n) / el.Seconds(),
		mbps:        float64(w.n*w.size) / el.Seconds() / 1e6,
		p50:         lat[len(lat)/2],
		p99:         lat[len(lat)*99/100],
		n:           w.n,
		elapsed:     el,
		machineBusy: busy,
	}
}

// machineCores is the number of cores /proc/stat lists, set by machineCPU.
var machineCores int

// machineCPU returns the busy time of all the machine's cores so far (harness.MachineCPU).
func machineCPU() time.Duration {
	busy, cores, err := harness.MachineCPU()
	if err != nil {
		fail(fmt.Errorf("the machine's CPU time: %w", err))
	}
	machineCores = cores
	return busy
}

// idleCPU is the CPU a proxy process uses in two seconds without traffic.
func idleCPU(pid int) time.Duration {
	before := procCPU(pid)
	time.Sleep(2 * time.Second)
	return procCPU(pid) - before
}

// procCPUSplit returns the user and the system CPU time of process pid (all threads); 0 for pid 0.
func procCPUSplit(pid int) (user, sys time.Duration) {
	if pid == 0 {
		return 0, 0
	}
	user, sys, err := harness.ProcCPUSplit(pid)
	if err != nil {
		fail(fmt.Errorf("CPU time of process %d: %w", pid, err))
	}
	return user, sys
}

// procCPU returns the user+system CPU time of process pid (all threads); 0 for pid 0.
func procCPU(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	d, err := harness.ProcCPU(pid)
	if err != nil {
		fail(fmt.Errorf("CPU time of process %d: %w", pid, err))
	}
	return d
}

// process is a proxy the bench started.
type process struct {
	target
	cmd  *exec.Cmd
	done chan struct{}
	once sync.Once
	// stopSignal ends the process gracefully.
	stopSignal os.Signal
	cleanup    func()
}

func track(p *process) {
	runningMu.Lock()
	defer runningMu.Unlock()
	running = append(running, p)
}

func (p *process) stop() {
	p.once.Do(func() {
		_ = p.cmd.Process.Signal(p.stopSignal)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if p.cleanup != nil {
			p.cleanup()
		}
	})
}

// envList is a repeatable KEY=VALUE flag.
type envList []string

func (l *envList) String() string { return strings.Join(*l, " ") }
func (l *envList) Set(v string) error {
	if !strings.Contains(v, "=") {
		return fmt.Errorf("%q: want KEY=VALUE", v)
	}
	*l = append(*l, v)
	return nil
}

// oursEnv is -proxy-env.
var oursEnv envList

// startOurs runs exe (this binary, or a baseline build of it) as our proxy in front of broker
// addr and waits for the address it prints.
func startOurs(exe, name, brokerAddr, cpuprofile string, readBuf int, env ...string) (*process, error) {
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childEnv+"="+brokerAddr, "REBATCHPROXY_BENCH_CPUPROFILE="+cpuprofile,
		"REBATCHPROXY_BENCH_READBUF="+strconv.Itoa(readBuf))
	cmd.Env = append(cmd.Env, env...)
	if tlsFiles != nil {
		cmd.Env = append(cmd.Env, tlsEnv+"="+tlsFiles.dir)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{}), stopSignal: syscall.SIGTERM}
	go func() { _ = cmd.Wait(); close(p.done) }()
	track(p)
	a, err := harness.WaitListening(out, p.done, 15*time.Second)
	if err != nil {
		p.stop()
		return nil, err
	}
	p.target = target{name: name, url: "pulsar://" + a, pid: cmd.Process.Pid}
	if tlsFiles != nil {
		p.target.url = "pulsar+ssl://" + a
	}
	return p, nil
}

// serveChild is the proxy process: it serves until SIGTERM, optionally profiling its CPU.
func serveChild(brokerAddr string) {
	cfg := proxy.DefaultConfig()
	cfg.Listen, cfg.Brokers = "127.0.0.1:0", []string{brokerAddr}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	tlsDir := os.Getenv(tlsEnv)
	if tlsDir != "" {
		f := certFiles(tlsDir)
		cfg.BrokerTLS, cfg.BrokerTLSTrustCertsFile = true, f.CA
		cfg.TLSListen, cfg.TLSCertFile, cfg.TLSKeyFile = "127.0.0.1:0", f.ServerCert, f.ServerKey
	}
	if n, _ := strconv.Atoi(os.Getenv("REBATCHPROXY_BENCH_READBUF")); n > 0 {
		cfg.ReadBufferCap = n
	}
	if n, _ := strconv.Atoi(os.Getenv("REBATCHPROXY_BENCH_SOFT_LIMIT")); n > 0 {
		cfg.SoftBufferLimit = n // -proxy-env REBATCHPROXY_BENCH_SOFT_LIMIT=BYTES
	}
	if n, _ := strconv.Atoi(os.Getenv("REBATCHPROXY_BENCH_EVENT_LOOPS")); n > 0 {
		cfg.EventLoops = n // -proxy-env REBATCHPROXY_BENCH_EVENT_LOOPS=N
	}
	srv, err := proxy.New(cfg)
	if err != nil {
		fail(err)
	}
	if f := os.Getenv("REBATCHPROXY_BENCH_CPUPROFILE"); f != "" {
		out, err := os.Create(f)
		if err != nil {
			fail(err)
		}
		if err := pprof.StartCPUProfile(out); err != nil {
			fail(err)
		}
		defer func() { pprof.StopCPUProfile(); _ = out.Close() }()
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	a := srv.Addr(ctx)
	cancel()
	if a == "" {
		fail(fmt.Errorf("proxy did not start: %v", <-done))
	}
	if tlsDir != "" {
		a = srv.TLSAddr() // clients use the TLS listener
	}
	fmt.Println("listening " + a)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
	case err := <-done:
		fail(fmt.Errorf("proxy stopped: %v", err))
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
}

// startJava runs Pulsar's own proxy (bin/pulsar proxy) in front of the broker, on free
// loopback ports, and waits until its service port accepts connections.
func startJava(home, brokerURL, brokerWeb, brokerAddr string) (*process, error) {
	if _, err := os.Stat(filepath.Join(home, "bin", "pulsar")); err != nil {
		return nil, fmt.Errorf("no Pulsar distribution at %s (e2e/pulsar/pulsar.sh start downloads it): %w", home, err)
	}
	_, brokerPort, err := net.SplitHostPort(brokerAddr)
	if err != nil {
		return nil, err
	}
	servicePort, err := harness.FreePort()
	if err != nil {
		return nil, err
	}
	webPort, err := harness.FreePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "bench-java-proxy-")
	if err != nil {
		return nil, err
	}
	base, err := os.ReadFile(filepath.Join(home, "conf", "proxy.conf"))
	if err != nil {
		return nil, err
	}
	// Later keys win in a Java properties file: the distribution's defaults, then ours.
	conf := string(base) + fmt.Sprintf(`
# bench overrides
brokerServiceURL=%s
brokerWebServiceURL=%s
servicePort=%d
webServicePort=%d
bindAddress=127.0.0.1
advertisedAddress=127.0.0.1
clusterName=standalone
brokerProxyAllowedTargetPorts=%s
`, brokerURL, brokerWeb, servicePort, webPort, brokerPort)
	tlsPort := servicePort
	if tlsFiles != nil {
		if tlsPort, err = harness.FreePort(); err != nil {
			return nil, err
		}
		conf += fmt.Sprintf(`brokerServiceURL=%s
servicePortTls=%d
tlsCertificateFilePath=%s
tlsKeyFilePath=%s
tlsEnabledWithBroker=true
brokerServiceURLTLS=%s
brokerClientTrustCertsFilePath=%s
tlsHostnameVerificationEnabled=true
# Required with tlsEnabledWithBroker; the benchmark sends no HTTP, and the broker has no HTTPS port.
brokerWebServiceURLTLS=%s
`, brokerPlainURL, tlsPort, tlsFiles.ServerCert, tlsFiles.ServerKey, brokerURL, tlsFiles.CA, strings.Replace(brokerWeb, "http://", "https://", 1))
	}
	confPath := filepath.Join(dir, "proxy.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "stdout.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(filepath.Join(home, "bin", "pulsar"), "proxy")
	cmd.Env = append(os.Environ(),
		"PULSAR_PROXY_CONF="+confPath,
		"PULSAR_LOG_DIR="+dir,
		"PULSAR_MEM=-Xms512m -Xmx512m -XX:MaxDirectMemorySize=512m",
		"PULSAR_GC=-XX:+UseG1GC -XX:ParallelGCThreads=2 -XX:ConcGCThreads=1 -XX:+PerfDisableSharedMem",
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{}), stopSignal: syscall.SIGTERM,
		cleanup: func() { _ = logf.Close(); _ = os.RemoveAll(dir) }}
	go func() { _ = cmd.Wait(); close(p.done) }()
	track(p)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(tlsPort))
	deadline := time.Now().Add(90 * time.Second)
	for {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			_ = c.Close()
			break
		}
		select {
		case <-p.done:
			tail, _ := os.ReadFile(filepath.Join(dir, "stdout.log"))
			p.stop()
			return nil, fmt.Errorf("exited before listening:\n%s", lastLines(string(tail), 20))
		case <-time.After(300 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			tail, _ := os.ReadFile(filepath.Join(dir, "stdout.log"))
			p.stop()
			return nil, fmt.Errorf("not listening on %s after 90 s:\n%s", addr, lastLines(string(tail), 20))
		}
	}
	p.target = target{name: "java", url: "pulsar://" + addr, pid: cmd.Process.Pid}
	if tlsFiles != nil {
		p.target.url = "pulsar+ssl://" + addr
	}
	return p, nil
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}
