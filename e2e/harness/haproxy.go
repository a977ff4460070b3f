package harness

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// HAProxy is HAProxy (the Debian package's binary) in TCP mode on a loopback port, balancing
// new connections round robin over backends and checking each every 250 ms, so a killed one is
// out of the rotation within about half a second and back as soon as it listens again.
type HAProxy struct {
	Addr string // host:port clients connect to
}

// StartHAProxy runs haproxy in front of backends (host:port each) until the test ends; a
// missing haproxy fails the test, naming the package.
func StartHAProxy(t *testing.T, backends []string) *HAProxy {
	t.Helper()
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		t.Fatal("haproxy is not installed (Debian: apt-get install haproxy; .ci/run installs it)")
	}
	h := &HAProxy{Addr: FreeAddr(t)}
	var cfg strings.Builder
	fmt.Fprintf(&cfg, `global
  maxconn 4096
defaults
  mode tcp
  timeout connect 2s
  timeout client 10m
  timeout server 10m
frontend pulsar
  bind %s
  default_backend proxies
backend proxies
  balance roundrobin
  default-server inter 250ms fall 1 rise 1
`, h.Addr)
	for i, b := range backends {
		fmt.Fprintf(&cfg, "  server proxy%d %s check\n", i, b)
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(conf, []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "haproxy.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-db", "-f", conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("haproxy: %v", err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
		_, _ = cmd.Process.Wait()
		logf.Close()
	})
	for deadline := time.Now().Add(10 * time.Second); !listening(h.Addr); {
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logf.Name())
			t.Fatalf("haproxy did not listen on %s within 10 s:\n%s", h.Addr, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return h
}

// listening reports whether something accepts TCP connections at addr.
func listening(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}
