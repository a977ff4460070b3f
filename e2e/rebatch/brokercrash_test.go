package rebatch_test

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
)

// Given a private broker with de-duplication on and, per case, a pulsar-client-go (latest)
// producer with a fixed name sending 5,000 keyed messages asynchronously (default batching or
// none), paced and started together, through its own proxy process under passthrough,
// coalesce, properties or buckets, or directly to the broker as the baseline,
// when the broker is killed with SIGKILL once every case has 15% acknowledged (sends in
// flight, some persisted and not yet acknowledged) and recovered on its data,
// then every client reconnects and resends, every send succeeds, and the broker stores every
// message exactly once with its own per-message sequence id; under properties every stored
// entry holds one group, stamped as its outer properties.
func TestKill9BrokerMidStreamStoresEveryMessageOnce(t *testing.T) {
	b, err := harness.StartBroker(harness.Options{Dedup: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop() })
	cases := []crashCase{
		{"direct/batching", "", true, false},
		{"direct/unbatched", "", false, false},
		{"passthrough/batching", "passthrough", true, false},
		{"passthrough/unbatched", "passthrough", false, false},
		{"coalesce/batching", "coalesce", true, false},
		{"coalesce/unbatched", "coalesce", false, false},
		{"properties/batching", "properties", true, false},
		{"buckets/batching", "buckets", true, false},
		{"buckets/unbatched", "buckets", false, false},
	}
	crash := newBrokerCrash(b, len(cases))
	var mu sync.Mutex
	var results []crashResult
	t.Cleanup(func() { // after the subtests
		var sb strings.Builder
		fmt.Fprintf(&sb, "stored after kill -9 of the broker and its recovery (5,000 messages each; %s):\n%s\n", crash, crashHeader)
		for _, r := range results {
			fmt.Fprintf(&sb, "%s\n", r)
		}
		t.Log(sb.String())
	})
	// The cases wait for each other, so they run at once whatever -parallel says: each t.Run
	// from its own goroutine, none of them calling t.Parallel.
	var inFlight atomic.Int32 // cases with sends in flight at the kill
	var wg sync.WaitGroup
	for _, tc := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(tc.name, func(t *testing.T) {
				r := runCrashCase(t, b, tc, crash)
				if r.sentAtFault-r.ackedAtFault >= 100 {
					inFlight.Add(1)
				}
				mu.Lock()
				results = append(results, r)
				mu.Unlock()
				r.check(t)
			})
		}()
	}
	wg.Wait()
	// A case whose sends were all acknowledged at the kill only tests a reconnect; the crash
	// must catch most of them mid-stream (every one did in the runs so far).
	if n := int(inFlight.Load()); !t.Failed() && n < len(cases)/2+1 {
		t.Errorf("only %d of %d cases had 100 or more sends in flight at the kill: the crash did not land mid-stream", n, len(cases))
	}
}

// brokerCrashWait bounds each wait of a case for the others (a case that failed before the
// fault never arrives).
const brokerCrashWait = 3 * time.Minute

// brokerCrash is one kill -9 of a broker shared by several crash cases: they start sending
// together, the broker is killed once each has acknowledged 15%, and it is recovered once, by
// the first case to hand its held-back sends to its client (the others' sends go meanwhile).
// Which goroutine: any case's; the fields after mu are guarded by it or by the channels.
type brokerCrash struct {
	b *harness.Broker

	mu                sync.Mutex
	toStart, toArrive int
	started, killed   chan struct{}
	killErr           error
	killedAt          time.Time

	recovery   sync.Once
	recoverErr error
	downFor    time.Duration
}

func newBrokerCrash(b *harness.Broker, cases int) *brokerCrash {
	return &brokerCrash{b: b, toStart: cases, toArrive: cases, started: make(chan struct{}), killed: make(chan struct{})}
}

// String says how long the broker was down, for the results table.
func (c *brokerCrash) String() string {
	return fmt.Sprintf("broker down %.1f s", c.downFor.Seconds())
}

// gap paces each case to about 2,000 messages a second (10 per gap), so that the fast cases
// (batching producers) are still sending when the slowest (unbatched, one entry per message)
// has acknowledged 15%: at 2.5 ms a loaded CI machine once saw 6 of 9 cases acknowledge all
// they had sent first.
func (*brokerCrash) gap() time.Duration { return 5 * time.Millisecond }
func (*brokerCrash) at(n int) int64     { return int64(n * 15 / 100) }

// begin waits until every case is set up, so that they all send at the same time.
func (c *brokerCrash) begin(t *testing.T) {
	c.mu.Lock()
	c.toStart--
	if c.toStart == 0 {
		close(c.started)
	}
	c.mu.Unlock()
	awaitOthers(t, c.started, "were not set up")
}

// inject waits until every case has reached the fault; the last to arrive kills the broker.
func (c *brokerCrash) inject(t *testing.T, _ *harness.ProcessProxy, _ string) {
	c.mu.Lock()
	c.toArrive--
	if c.toArrive == 0 {
		c.killErr, c.killedAt = c.b.Kill9(), time.Now()
		close(c.killed)
	}
	c.mu.Unlock()
	awaitOthers(t, c.killed, "did not reach the fault")
	if c.killErr != nil {
		t.Fatalf("kill -9 of the broker: %v", c.killErr)
	}
}

// mend recovers the broker once; every case returns once it is ready again.
func (c *brokerCrash) mend(t *testing.T, _ *harness.ProcessProxy) {
	c.recovery.Do(func() {
		c.recoverErr = c.b.Recover()
		c.downFor = time.Since(c.killedAt)
	})
	if c.recoverErr != nil {
		t.Fatalf("recovering the broker: %v", c.recoverErr)
	}
}

// awaitOthers waits until done is closed by the last case to arrive, failing t after
// brokerCrashWait: the other cases then "what" in time.
func awaitOthers(t *testing.T, done <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(brokerCrashWait):
		t.Fatalf("the other cases %s within %v", what, brokerCrashWait)
	}
}
