package proxy_test

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/proxy"
	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// lookupClient is a raw protocol connection through the proxy that sends LOOKUPs and counts
// the answers; its reader runs on a goroutine of its own.
type lookupClient struct {
	c        net.Conn
	mu       sync.Mutex
	answered int
	refused  int
	worst    time.Duration
	sentAt   map[uint64]time.Time
	done     chan error
	want     int
	progress chan struct{} // one value per answer
}

func newLookupClient(t *testing.T, addr string, want int) *lookupClient {
	t.Helper()
	c := dialT(t, addr)
	if _, err := c.Write(rawConnect(t, "", "")); err != nil {
		t.Fatal(err)
	}
	if cmd := readCommand(t, c); cmd.GetType() != pulsarpb.BaseCommand_CONNECTED {
		t.Fatalf("CONNECT answered %v", cmd.GetType())
	}
	_ = c.SetReadDeadline(time.Time{})
	lc := &lookupClient{c: c, sentAt: map[uint64]time.Time{}, done: make(chan error, 1), want: want, progress: make(chan struct{}, want)}
	go func() { lc.done <- lc.read() }()
	return lc
}

// read takes lookup answers until want have come.
func (lc *lookupClient) read() error {
	var buf []byte
	chunk := make([]byte, 256<<10)
	for n := 0; n < lc.want; {
		f, k, err := wire.ReadFrame(buf, 5<<20)
		if errors.Is(err, wire.ErrIncomplete) {
			m, rerr := lc.c.Read(chunk)
			buf = append(buf, chunk[:m]...)
			if rerr != nil && (m == 0 || rerr != io.EOF) {
				return fmt.Errorf("after %d answers: %w", n, rerr)
			}
			continue
		}
		if err != nil {
			return err
		}
		var cmd pulsarpb.BaseCommand
		if err := wire.DecodeCommand(f, &cmd); err != nil {
			return err
		}
		buf = buf[k:]
		if cmd.GetType() != pulsarpb.BaseCommand_LOOKUP_RESPONSE {
			continue // pings and the like
		}
		r := cmd.GetLookupTopicResponse()
		lc.mu.Lock()
		if at, ok := lc.sentAt[r.GetRequestId()]; ok {
			lc.worst = max(lc.worst, time.Since(at))
			delete(lc.sentAt, r.GetRequestId())
		}
		if r.GetResponse() == pulsarpb.CommandLookupTopicResponse_Failed && r.GetError() == pulsarpb.ServerError_TooManyRequests {
			lc.refused++
		} else {
			lc.answered++
		}
		lc.mu.Unlock()
		n++
		lc.progress <- struct{}{}
	}
	return nil
}

// send writes LOOKUPs for request ids from..to-1 in one write.
func (lc *lookupClient) send(t *testing.T, topic string, from, to uint64) error {
	var b []byte
	now := time.Now()
	lc.mu.Lock()
	for id := from; id < to; id++ {
		b = append(b, rawLookup(t, topic, id)...)
		lc.sentAt[id] = now
	}
	lc.mu.Unlock()
	_, err := lc.c.Write(b)
	return err
}

// Given a proxy with its default lookup bounds (1,024 in flight in all, 256 per connection) in
// front of the real broker,
// when one connection pipelines 100,000 LOOKUPs while another sends 500, 10 at a time,
// then the second has none refused, the first is refused only its own excess, and the refusals
// take a bounded number of log lines (one per 10 s per connection).
func TestLookupFloodCostsOnlyTheFlooder(t *testing.T) {
	b := harness.Default(t)
	logs := &harness.LogBuffer{}
	px, err := harness.StartProxy(b.ServiceURL, func(c *proxy.Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Stop)
	const flood, polite, window = 100000, 500, 10
	topic := "persistent://public/default/lookup-flood"
	flooder := newLookupClient(t, px.Addr, flood)
	other := newLookupClient(t, px.Addr, polite)
	start := time.Now()

	floodErr := make(chan error, 1)
	go func() {
		for id := uint64(0); id < flood; id += 1000 {
			if err := flooder.send(t, topic, id, id+1000); err != nil {
				floodErr <- err
				return
			}
		}
		floodErr <- nil
	}()
	otherDone := other.done // nil once its reader has ended well (its answers are all in progress)
	for id := uint64(0); id < polite; id += window {
		if err := other.send(t, topic, id, id+window); err != nil {
			t.Fatal(err)
		}
		for k := 0; k < window; k++ {
			select {
			case <-other.progress:
			case err := <-otherDone:
				if err != nil {
					t.Fatalf("second connection: %v", err)
				}
				otherDone, k = nil, k-1
			case <-time.After(30 * time.Second):
				t.Fatalf("second connection: no answer in 30 s")
			}
		}
	}
	politeTook := time.Since(start)
	if err := <-floodErr; err != nil {
		t.Fatalf("flooder write: %v", err)
	}
	select {
	case err := <-flooder.done:
		if err != nil {
			t.Fatalf("flooder: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("flooder: only %d of %d answers after 2 minutes", flooder.answered+flooder.refused, flood)
	}
	took := time.Since(start)
	lines := strings.Count(logs.String(), "lookup refused")
	t.Logf("flooder: %d answered, %d refused of %d in %v; second connection: %d answered, %d refused of %d in %v, worst %v; %d log lines for refusals",
		flooder.answered, flooder.refused, flood, took.Round(time.Millisecond), other.answered, other.refused, polite,
		politeTook.Round(time.Millisecond), other.worst.Round(time.Millisecond), lines)
	if other.refused != 0 || other.answered != polite {
		t.Errorf("second connection: %d refused, %d answered of %d", other.refused, other.answered, polite)
	}
	if flooder.refused == 0 {
		t.Errorf("the flooder was never refused: the per-connection bound did not apply")
	}
	if limit := 1 + int(took/(10*time.Second)); lines > limit {
		t.Errorf("%d log lines for refused lookups in %v, want at most %d", lines, took, limit)
	}
}
