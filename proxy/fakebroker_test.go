package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// The tests in this package run a real Server against fakeBroker, an
// in-process TCP listener that the test scripts frame by frame, and talk to
// the proxy with raw protocol frames (send, then expect).

type fakeBroker struct {
	ln    net.Listener
	conns chan net.Conn
}

func newFakeBroker(t *testing.T) *fakeBroker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fb := &fakeBroker{ln: ln, conns: make(chan net.Conn, 16)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fb.conns <- c
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return fb
}

func (fb *fakeBroker) addr() string { return fb.ln.Addr().String() }

// accept returns the next connection the proxy opened to the broker.
func (fb *fakeBroker) accept(t *testing.T) net.Conn {
	t.Helper()
	select {
	case c := <-fb.conns:
		t.Cleanup(func() { c.Close() })
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("proxy did not connect to the broker")
		return nil
	}
}

// logBuffer collects the proxy's log lines for assertions. A log line is an event a test can
// wait for (waitFor): every write wakes the waiters.
type logBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	written chan struct{} // closed and replaced by every Write
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.written != nil {
		close(l.written)
		l.written = nil
	}
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// next returns whether the log holds s now, and a channel closed by the next write.
func (l *logBuffer) next(s string) (bool, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if strings.Contains(l.b.String(), s) {
		return true, nil
	}
	if l.written == nil {
		l.written = make(chan struct{})
	}
	return false, l.written
}

// waitFor waits (at most 5 s) until a log line containing s is written.
func (l *logBuffer) waitFor(t *testing.T, s string) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		found, written := l.next(s)
		if found {
			return
		}
		select {
		case <-written:
		case <-deadline:
			t.Fatalf("log has no %q:\n%s", s, l.String())
		}
	}
}

// startProxy runs a Server in front of the given brokers.
func startProxy(t *testing.T, brokers []string, mod func(*Config)) (*Server, string, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.Brokers = brokers
	cfg.EventLoops = 1
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if mod != nil {
		mod(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve() }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addr := srv.Addr(ctx)
	if addr == "" {
		t.Fatalf("proxy did not start: %v", <-done)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	})
	return srv, addr, logs
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func frame(t *testing.T, cmd *pulsarpb.BaseCommand) []byte {
	t.Helper()
	b, err := wire.AppendCommandFrame(nil, cmd)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func send(t *testing.T, c net.Conn, b []byte) {
	t.Helper()
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
}

// readRaw reads one frame's bytes.
func readRaw(t *testing.T, c net.Conn) []byte {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var hdr [4]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		t.Fatalf("reading a frame: %v", err)
	}
	b := make([]byte, 4+binary.BigEndian.Uint32(hdr[:]))
	copy(b, hdr[:])
	if _, err := io.ReadFull(c, b[4:]); err != nil {
		t.Fatalf("reading a frame: %v", err)
	}
	return b
}

// expect reads one frame and decodes it.
func expect(t *testing.T, c net.Conn, want pulsarpb.BaseCommand_Type) (*pulsarpb.BaseCommand, []byte) {
	t.Helper()
	b := readRaw(t, c)
	f, _, err := wire.ReadFrame(b, wire.DefaultMaxMessageSize)
	if err != nil {
		t.Fatalf("bad frame from proxy: %v", err)
	}
	var cmd pulsarpb.BaseCommand
	if err := wire.DecodeCommand(f, &cmd); err != nil {
		t.Fatal(err)
	}
	if cmd.GetType() != want {
		t.Fatalf("got %s, want %s", cmd.GetType(), want)
	}
	return &cmd, b
}

// expectClosed waits for EOF (or reset) on c.
func expectClosed(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatal("connection still open")
		}
		return
	}
}

func connectCmd(proxyTo string) *pulsarpb.BaseCommand {
	c := &pulsarpb.CommandConnect{
		ClientVersion:   proto.String("test-client"),
		ProtocolVersion: proto.Int32(20),
		AuthMethodName:  proto.String("token"),
		AuthData:        []byte("secret-token"),
	}
	if proxyTo != "" {
		c.ProxyToBrokerUrl = proto.String(proxyTo)
	}
	return &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_CONNECT.Enum(), Connect: c}
}

func connectedCmd(maxSize int32) *pulsarpb.BaseCommand {
	return &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_CONNECTED.Enum(), Connected: &pulsarpb.CommandConnected{
		ServerVersion: proto.String("fake"), ProtocolVersion: proto.Int32(20), MaxMessageSize: proto.Int32(maxSize),
		FeatureFlags: &pulsarpb.FeatureFlags{SupportsAuthRefresh: proto.Bool(true)},
	}}
}

// handshake connects a raw client through the proxy to the fake broker.
func handshake(t *testing.T, proxyAddr string, fb *fakeBroker, proxyTo string) (client, broker net.Conn) {
	t.Helper()
	client = dial(t, proxyAddr)
	send(t, client, frame(t, connectCmd(proxyTo)))
	broker = fb.accept(t)
	expect(t, broker, pulsarpb.BaseCommand_CONNECT)
	send(t, broker, frame(t, connectedCmd(1<<20)))
	expect(t, client, pulsarpb.BaseCommand_CONNECTED)
	return client, broker
}
