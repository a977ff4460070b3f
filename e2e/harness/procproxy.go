package harness

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The proxy as a separate process, built from ./cmd/proxy, so a test can kill -9 it and start
// it again on the same port, as an operator's supervisor would, or read its peak RSS.

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// ProxyBinary builds the proxy command once per test binary and returns its path.
func ProxyBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "rebatch-e2e-proxy-")
		if err != nil {
			buildErr = err
			return
		}
		builtBin = filepath.Join(dir, "proxy")
		cmd := exec.Command("go", "build", "-o", builtBin, "./cmd/proxy")
		cmd.Dir = RepoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/proxy: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

// ProcessProxy is one proxy process slot: a fixed listen port and config file, and the process
// currently running there (if any). Its methods are for the test's goroutine.
type ProcessProxy struct {
	t       *testing.T
	bin     string
	config  string
	listen  string
	metrics string
	// LogPath is the file the process logs to (every start appended, after a marker line).
	LogPath string
	cmd     *exec.Cmd
	exited  chan error
	starts  int
}

// FreeAddr returns a loopback host:port free at the time of the call.
func FreeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// StartProcessProxy writes a config file in front of b with the given further settings (YAML
// lines, e.g. a policies section) and starts the proxy process on a free port; the test's
// cleanup kills it and, if the test failed, logs the end of its log.
func StartProcessProxy(t *testing.T, b *Broker, moreYAML string) *ProcessProxy {
	t.Helper()
	return StartProcessProxyFor(t, b.ServiceURL, moreYAML)
}

// StartProcessProxyFor is StartProcessProxy in front of brokerURLs (the proxy's broker-url:
// one service URL, or several brokers comma-separated).
func StartProcessProxyFor(t *testing.T, brokerURLs, moreYAML string) *ProcessProxy {
	t.Helper()
	dir := t.TempDir()
	p := &ProcessProxy{t: t, bin: ProxyBinary(t),
		config: filepath.Join(dir, "proxy.yaml"), LogPath: filepath.Join(dir, "proxy.log")}
	// The ports were free when FreeAddr picked them; another process (any client's outgoing
	// connection takes ephemeral ports too) may bind one before the proxy does. A first start
	// that fails so is tried again on two new ports.
	for attempt := 1; ; attempt++ {
		p.listen, p.metrics = FreeAddr(t), FreeAddr(t)
		cfg := fmt.Sprintf("listen: %s\nbroker-url: %s\nmetrics-listen: %s\nlog-level: info\n%s",
			p.listen, brokerURLs, p.metrics, moreYAML)
		if err := os.WriteFile(p.config, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		err := p.TryStart()
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "address already in use") || attempt == 5 {
			t.Fatal(err)
		}
		t.Logf("proxy start %d: a port was taken meanwhile; trying two new ones: %v", attempt, err)
	}
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			if log, err := os.ReadFile(p.LogPath); err == nil {
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

// URL is the proxy's pulsar:// service URL.
func (p *ProcessProxy) URL() string { return "pulsar://" + p.listen }

// Listen is the proxy's host:port.
func (p *ProcessProxy) Listen() string { return p.listen }

// StartRetrying starts the proxy, trying again every 250 ms while it exits at start with
// "address already in use", until within. It returns how many attempts failed so.
func (p *ProcessProxy) StartRetrying(within time.Duration) (bindFailures int) {
	p.t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := p.TryStart()
		if err == nil {
			return bindFailures
		}
		if !strings.Contains(err.Error(), "address already in use") || time.Now().After(deadline) {
			p.t.Fatal(err)
		}
		// Keep the log readable: drop this attempt's section.
		if log, rerr := os.ReadFile(p.LogPath); rerr == nil {
			mark := fmt.Sprintf("---- start %d ----\n", p.starts)
			if i := bytes.LastIndex(log, []byte(mark)); i >= 0 {
				_ = os.Truncate(p.LogPath, int64(i))
			}
		}
		bindFailures++
		time.Sleep(250 * time.Millisecond)
	}
}

// TryStart runs the proxy and waits until /readyz answers 200 and the listen port accepts.
func (p *ProcessProxy) TryStart() error {
	logf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
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
			return fmt.Errorf("proxy exited at start %d: %v\n%s", p.starts, err, p.startLog())
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
	return fmt.Errorf("proxy not ready on %s (metrics %s) within 15 s; its log:\n%s", p.listen, p.metrics, p.startLog())
}

// startLog is the end of what the current start wrote to the log.
func (p *ProcessProxy) startLog() []byte {
	log, _ := os.ReadFile(p.LogPath)
	mark := fmt.Sprintf("---- start %d ----\n", p.starts)
	if i := bytes.LastIndex(log, []byte(mark)); i >= 0 {
		log = log[i+len(mark):]
	}
	return tail(log, 2048)
}

func (p *ProcessProxy) ready() bool {
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

// Kill9 sends SIGKILL and waits until the process is gone.
func (p *ProcessProxy) Kill9() {
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

// Stop ends the process (SIGKILL: nothing to drain at test end).
func (p *ProcessProxy) Stop() {
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

// MetricsText returns the proxy's /metrics lines starting with prefix.
func (p *ProcessProxy) MetricsText(prefix string) string {
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

// PeakRSS returns the running process's peak resident set size in bytes (VmHWM).
func (p *ProcessProxy) PeakRSS() (int64, error) {
	if p.cmd == nil {
		return 0, fmt.Errorf("the proxy is not running")
	}
	return PeakRSS(p.cmd.Process.Pid)
}

// PeakRSS returns process pid's peak resident set size in bytes (VmHWM of /proc/pid/status).
func PeakRSS(pid int) (int64, error) {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(st), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "VmHWM:" && f[2] == "kB" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}
