package proxy

import (
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/rebatchproxy/rebatchproxy/internal/testcert"
)

// liveMemory is the heap and the goroutine stacks in use after full collections.
func liveMemory() int64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc + ms.StackInuse)
}

// idleSessionBound is what an idle session may cost the process in this
// spec: the proxy's share plus the spec's own client and broker connections
// (crypto/tls keeps its record buffers). One read buffer held per side while
// it waits (64 KiB) is more than it allows: before the reader borrowed its
// arrays only once readable, a TLS client's session took 424 KiB.
const idleSessionBound = 128 << 10

// Given a proxy on each transport, and 100 sessions through it that each
// carried a 32 KiB SEND to the broker and a 32 KiB MESSAGE back,
// when the sessions sit idle,
// then each costs the process less than idleSessionBound: a side waiting
// for input holds no read buffer, so idle connections do not eat the memory
// budget (contract 7).
func TestAnIdleSessionHoldsNoReadBuffer(t *testing.T) {
	files, err := testcert.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// Each row starts a proxy and returns how to open a session through it.
	for _, tc := range []struct {
		name  string
		start func(t *testing.T) func() (client, broker net.Conn)
	}{
		{"plaintext client and broker (gnet)", func(t *testing.T) func() (net.Conn, net.Conn) {
			fb := newFakeBroker(t)
			_, addr, _ := startProxy(t, []string{fb.addr()}, nil)
			return func() (net.Conn, net.Conn) { return handshake(t, addr, fb, "") }
		}},
		{"TLS client, plaintext broker", func(t *testing.T) func() (net.Conn, net.Conn) {
			fb := newFakeBroker(t)
			srv, files, _ := startTLSProxy(t, fb, nil)
			return func() (net.Conn, net.Conn) { return tlsHandshake(t, srv, files, fb) }
		}},
		{"plaintext client, TLS broker", func(t *testing.T) func() (net.Conn, net.Conn) {
			fb := newFakeTLSBroker(t, files, "127.0.0.1")
			_, addr, _ := startBrokerTLSProxy(t, fb, files)
			return func() (net.Conn, net.Conn) { return handshake(t, addr, fb, "") }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const sessions = 100
			open := tc.start(t)
			toBrokerFrame, toClientFrame := sendFrames(1, 32<<10), messageFrames(t, 1, 32<<10)
			before := liveMemory()
			conns := make([]net.Conn, 0, 2*sessions)
			for range sessions {
				c, b := open()
				send(t, c, toBrokerFrame)
				readRaw(t, b)
				send(t, b, toClientFrame)
				readRaw(t, c)
				conns = append(conns, c, b)
			}

			time.Sleep(100 * time.Millisecond) // the readers go back to waiting
			perSession := (liveMemory() - before) / sessions

			t.Logf("%d KiB per idle session", perSession>>10)
			if perSession >= idleSessionBound {
				t.Errorf("an idle session costs %d KiB, more than %d KiB", perSession>>10, idleSessionBound>>10)
			}
			runtime.KeepAlive(conns)
		})
	}
}
