package main

import (
	"io"
	"net"
	"os"
	"strings"
	"testing"
)

// Given a metrics port another process already listens on,
// when the proxy starts with it as metrics-listen,
// then the start fails with exit status 1 and a line naming metrics-listen and the reason,
// instead of serving with a /readyz nobody can reach.
func TestATakenMetricsPortStopsTheStart(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := free.Addr().String()
	free.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = w
	defer func() { os.Stderr = stderr }()

	rc := run([]string{"--broker-url", "pulsar://127.0.0.1:6650", "--listen", listen,
		"--metrics-listen", taken.Addr().String(), "--log-level", "error"})

	os.Stderr = stderr
	w.Close()
	out, _ := io.ReadAll(r)
	if rc != 1 {
		t.Fatalf("exit status %d, want 1; stderr:\n%s", rc, out)
	}
	if !strings.Contains(string(out), "metrics-listen:") || !strings.Contains(string(out), "address already in use") {
		t.Fatalf("stderr does not name metrics-listen and the reason:\n%s", out)
	}
}
