package rebatch_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
)

// The proxy as a separate process, built from ./cmd/proxy, so a test can kill -9 it and start
// it again on the same port, as an operator's supervisor would.

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// proxyBinary builds the proxy command once per test binary.
func proxyBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "rebatch-e2e-proxy-")
		if err != nil {
			buildErr = err
			return
		}
		builtBin = filepath.Join(dir, "proxy")
		cmd := exec.Command("go", "build", "-o", builtBin, "./cmd/proxy")
		cmd.Dir = harness.RepoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/proxy: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

// procProxy is one proxy process slot: a fixed listen port and config file, and the process
// currently running there (if any).
type procProxy struct {
	t       *testing.T
	bin     string
	config  string
	listen  string
	metrics string
	logPath string
	cmd     *exec.Cmd
	exited  chan error
	starts  int
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startProcProxy writes a config file with the given policies section (YAML list items, already
// indented by two spaces) and starts the proxy process on a free port.
func startProcProxy(t *testing.T, b *harness.Broker, policiesYAML string) *procProxy {
	t.Helper()
	dir := t.TempDir()
	p := &procProxy{t: t, bin: proxyBinary(t), listen: freeAddr(t), metrics: freeAddr(t),
		config: filepath.Join(dir, "proxy.yaml"), logPath: filepath.Join(dir, "proxy.log")}
	cfg := fmt.Sprintf("listen: %s\nbroker-url: %s\nmetrics-listen: %s\nlog-level: info\npolicies:\n%s",
		p.listen, b.ServiceURL, p.metrics, policiesYAML)
	if err := os.WriteFile(p.config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	p.start()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			if log, err := os.ReadFile(p.logPath); err == nil {
				t.Logf("proxy log (last 4 KiB):\n%s", tail(log, 4096))
			}
		}
	})
	return p
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

func (p *procProxy) URL() string { return "pulsar://" + p.listen }

// start runs the proxy and waits until it is ready; a proxy that exits at start fails the test.
func (p *procProxy) start() {
	p.t.Helper()
	if err := p.tryStart(); err != nil {
		p.t.Fatal(err)
	}
}

// startRetrying starts the proxy, trying again every 250 ms while it exits at start with
// "address already in use", until within. It returns how many attempts failed so.
func (p *procProxy) startRetrying(within time.Duration) (bindFailures int) {
	p.t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := p.tryStart()
		if err == nil {
			return bindFailures
		}
		if !strings.Contains(err.Error(), "address already in use") || time.Now().After(deadline) {
			p.t.Fatal(err)
		}
		// Keep the log readable: drop this attempt's section.
		if log, rerr := os.ReadFile(p.logPath); rerr == nil {
			mark := fmt.Sprintf("---- start %d ----\n", p.starts)
			if i := bytes.LastIndex(log, []byte(mark)); i >= 0 {
				_ = os.Truncate(p.logPath, int64(i))
			}
		}
		bindFailures++
		time.Sleep(250 * time.Millisecond)
	}
}

// tryStart runs the proxy and waits until /readyz answers 200 and the listen port accepts.
func (p *procProxy) tryStart() error {
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	p.starts++
	fmt.Fprintf(logf, "---- start %d ----\n", p.starts)
	cmd := exec.Command(p.bin, "--config", p.config)
	cmd.Stdout, cmd.Stderr = logf, logf
	err = cmd.Start()
	logf.Close() // the child holds its own descriptor
	if err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			log, _ := os.ReadFile(p.logPath)
			mark := fmt.Sprintf("---- start %d ----\n", p.starts)
			if i := bytes.LastIndex(log, []byte(mark)); i >= 0 {
				log = log[i+len(mark):]
			}
			return fmt.Errorf("proxy exited at start %d: %v\n%s", p.starts, err, tail(log, 2048))
		default:
		}
		if p.ready() {
			p.cmd, p.exited = cmd, exited
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	<-exited
	return fmt.Errorf("proxy not ready on %s within 15 s", p.listen)
}

func (p *procProxy) ready() bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.metrics+"/readyz", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false
	}
	c, err := net.DialTimeout("tcp", p.listen, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// kill9 sends SIGKILL and waits until the process is gone.
func (p *procProxy) kill9() {
	p.t.Helper()
	if p.cmd == nil {
		return
	}
	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		p.t.Fatalf("kill -9 proxy: %v", err)
	}
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.t.Fatal("proxy did not die within 10 s of SIGKILL")
	}
	p.cmd = nil
}

// stop ends the process (SIGKILL: nothing to drain at test end).
func (p *procProxy) stop() {
	if p.cmd == nil {
		return
	}
	_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
	}
	p.cmd = nil
}

// metricsText returns the proxy's /metrics lines starting with prefix.
func (p *procProxy) metricsText(prefix string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.metrics+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	var out []string
	for _, l := range strings.Split(buf.String(), "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Given the proxy process with a producer connected through it (one message sent),
// when the proxy is killed with SIGKILL and started again on the same port one second later,
// then the new process listens on that port and the producer's next send succeeds.
func TestProxyRestartsOnSamePortAfterKill9(t *testing.T) {
	b := harness.Default(t)
	ns := newNamespace(t, b, "restart")
	pp := startProcProxy(t, b, fmt.Sprintf("  - topics: %s/*\n    policy: coalesce\n", ns))
	c := newClient(t, pp.URL())
	prod, err := c.CreateProducer(pulsar.ProducerOptions{Topic: "persistent://" + ns + "/t", DisableBatching: true})
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	if _, err := prod.Send(ctxT(t, 30*time.Second), &pulsar.ProducerMessage{Payload: []byte("before")}); err != nil {
		t.Fatal(err)
	}
	pp.kill9()
	time.Sleep(time.Second)
	if err := pp.tryStart(); err != nil {
		t.Fatalf("restart on %s one second after kill -9: %v", pp.listen, err)
	}
	if _, err := prod.Send(ctxT(t, 60*time.Second), &pulsar.ProducerMessage{Payload: []byte("after")}); err != nil {
		t.Fatalf("send after the restart: %v", err)
	}
}

var lastSeqRE = regexp.MustCompile(`msg="producer rebatched".* last_sequence_id=(-?\d+)`)

// lastLoggedSequenceID returns the last_sequence_id of the last producer the proxy logged as
// rebatched, or -2 when there is none.
func (p *procProxy) lastLoggedSequenceID() int64 {
	log, err := os.ReadFile(p.logPath)
	if err != nil {
		return -2
	}
	m := lastSeqRE.FindAllSubmatch(log, -1)
	if len(m) == 0 {
		return -2
	}
	v, err := strconv.ParseInt(string(m[len(m)-1][1]), 10, 64)
	if err != nil {
		return -2
	}
	return v
}
