package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

// Given a connection's reads (or writes), each a pause since the one before and a size,
// when they are counted one by one,
// then the traffic is sparse (raw system calls) only once two in a row were small and came after
// a pause: a stream (short pauses) or a backlog found after a pause (a large read) is not, and
// one such read ends a sparse run.
func TestTrafficIsSparseOnlyAfterSmallMovesAfterPauses(t *testing.T) {
	type move struct {
		gap  time.Duration
		n    int
		want bool // sparse after this move
	}
	long, short := 2*quickGap, quickGap/5
	for _, tc := range []struct {
		name  string
		moves []move
	}{
		{"request-response", []move{{long, 150, false}, {long, 150, true}, {long, 150, true}}},
		{"a stream", []move{{short, 150, false}, {short, 150, false}, {short, 150, false}}},
		{"a backlog after a pause", []move{{long, 150, false}, {long, 64 << 10, false}, {long, 150, false}}},
		{"a stream ends a sparse run", []move{{long, 150, false}, {long, 150, true}, {short, 150, false}, {long, 150, false}, {long, 150, true}}},
		{"exactly the thresholds", []move{{quickGap, sparseMax, false}, {quickGap, sparseMax, true}, {quickGap - 1, 1, false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var run uint8
			for i, m := range tc.moves {

				run = nextGaps(run, int64(m.gap), m.n)

				if got := run >= sparseAfter; got != m.want {
					t.Fatalf("move %d (%v after the last, %d bytes): sparse %v, want %v", i, m.gap, m.n, got, m.want)
				}
			}
		})
	}
}

// loopbackPair returns both ends of a loopback TCP connection.
func loopbackPair(t *testing.T) (near, far net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if far, err = net.Dial("tcp", ln.Addr().String()); err != nil {
		t.Fatal(err)
	}
	if near, err = ln.Accept(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { near.Close(); far.Close() })
	return near, far
}

// sparseMessage is message i of the sparse-traffic specs: 100 bytes that say which it is.
func sparseMessage(i int) []byte { return fmt.Appendf(nil, "%-100d", i) }

// Given a rawConn reading a loopback TCP connection as it does under TLS, whose peer writes a
// 100-byte message every 2 ms,
// when the messages are read one by one (from the third on with raw read(2)s, which find the
// socket empty, wait for it, and read),
// then every message arrives intact and in order.
func TestRawConnReadsSparseTrafficIntact(t *testing.T) {
	near, far := loopbackPair(t)
	r := newRawConn(near)
	r.readBuffered = true
	const n = 6
	go func() {
		for i := range n {
			time.Sleep(2 * time.Millisecond)
			if _, err := far.Write(sparseMessage(i)); err != nil {
				return
			}
		}
	}()
	for i := range n {
		raw := r.readGaps >= sparseAfter
		got := make([]byte, 100)

		_, err := io.ReadFull(r, got)

		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if !bytes.Equal(got, sparseMessage(i)) {
			t.Fatalf("message %d read as %q", i, got)
		}
		if i >= 2 && !raw {
			t.Fatalf("message %d, 2 ms after the one before: read with an ordinary call", i)
		}
	}
}

// Given a started rawConn on a loopback TCP connection,
// when it writes a 100-byte message every 2 ms (from the second on with raw write(2)s),
// then the peer reads every message intact and in order.
func TestRawConnWritesSparseTrafficIntact(t *testing.T) {
	near, far := loopbackPair(t)
	r := newRawConn(near)
	r.start()
	const n = 6
	for i := range n {
		time.Sleep(2 * time.Millisecond)

		if _, err := r.Write(sparseMessage(i)); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}

		r.mu.Lock()
		raw := r.writeGaps >= sparseAfter
		r.mu.Unlock()
		if i >= 1 && !raw {
			t.Fatalf("message %d, 2 ms after the one before: written with an ordinary call", i)
		}
	}
	got := make([]byte, n*100)
	_ = far.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(far, got); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if m := got[i*100 : (i+1)*100]; !bytes.Equal(m, sparseMessage(i)) {
			t.Fatalf("message %d arrived as %q", i, m)
		}
	}
}
