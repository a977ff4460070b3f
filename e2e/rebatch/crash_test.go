package rebatch_test

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
)

// crashCase is one run of the crash scenario: which path the producer's TCP connection takes
// and how that path is broken mid-stream.
type crashCase struct {
	name     string
	policy   string // "" = direct to the broker, the fault is a topic unload
	batching bool
	keyBased bool // batching with pulsar-client-go's key-based batcher: one SEND per key
}

// crashResult is what the broker stored after the fault, counted per message.
type crashResult struct {
	name         string
	entries      int
	stored       int // messages in stored entries
	distinct     int
	duplicates   int // stored copies beyond the first
	missing      int
	wrongSeq     int // stored with a per-message sequence id other than its index
	mixedEntries int // properties: entries whose messages or outer properties disagree
	sendErrors   int
	ackedAtFault int64
	sentAtFault  int64
	// lastSeqAfter is the last_sequence_id the broker gave the re-created producer (from the
	// proxy's log; -2 when unknown): messages up to it were persisted before the client
	// resent, so those of them not acknowledged at the fault were resent as duplicates.
	lastSeqAfter int64
}

func (r crashResult) String() string {
	last := "?"
	if r.lastSeqAfter > -2 {
		last = strconv.FormatInt(r.lastSeqAfter, 10)
	}
	return fmt.Sprintf("%-26s %8d %8d %8d %6d %7d %7d %6d %7d %9d/%-5d %9s", r.name, r.entries, r.stored, r.distinct,
		r.duplicates, r.missing, r.wrongSeq, r.mixedEntries, r.sendErrors, r.ackedAtFault, r.sentAtFault, last)
}

// check fails t unless every send succeeded and every message was stored exactly once, with its
// own sequence id, and under properties in entries of one group.
func (r crashResult) check(t *testing.T) {
	if r.sendErrors > 0 || r.duplicates > 0 || r.missing > 0 || r.wrongSeq > 0 || r.mixedEntries > 0 {
		t.Errorf("not exactly once: %s\n%s", crashHeader, r)
	}
}

const crashHeader = "case                        entries   stored distinct   dups missing  badseq  mixed  errors  acked/sent@fault  last_seq_after"

// crashRegion gives message i a region in runs of 37, so the properties policy has groups to
// keep apart ("ap" is not an admitted value: its group is empty).
func crashRegion(i int) string { return []string{"us", "eu", "ap"}[(i/37)%3] }

// Given broker de-duplication on for the namespace and a pulsar-client-go (latest) producer with
// a fixed producer name sending 5,000 keyed messages (16 keys) asynchronously (default batching,
// key-based batching, or none),
// through the proxy run as a separate process with the passthrough, coalesce, properties or
// buckets policy, or directly to the broker as the baseline,
// when the proxy is killed with SIGKILL mid-stream and started again on the same port after
// one second (for the direct baseline: the topic is unloaded mid-stream),
// then the client reconnects and resends, every send succeeds, and the broker stores every
// message exactly once, each with its own per-message sequence id; under properties every
// stored entry holds one group, stamped as its outer properties.
func TestKill9ProxyMidStreamStoresEveryMessageOnce(t *testing.T) {
	b := harness.Default(t)
	cases := []crashCase{
		{"direct/batching", "", true, false},
		{"direct/unbatched", "", false, false},
		{"passthrough/batching", "passthrough", true, false},
		{"passthrough/unbatched", "passthrough", false, false},
		{"coalesce/batching", "coalesce", true, false},
		{"coalesce/unbatched", "coalesce", false, false},
		{"properties/batching", "properties", true, false},
		{"properties/unbatched", "properties", false, false},
		{"buckets/batching", "buckets", true, false},
		{"buckets/unbatched", "buckets", false, false},
		{"direct/key-based", "", true, true},
		{"passthrough/key-based", "passthrough", true, true},
		{"coalesce/key-based", "coalesce", true, true},
		{"properties/key-based", "properties", true, true},
		{"buckets/key-based", "buckets", true, true},
	}
	var mu sync.Mutex
	var results []crashResult
	t.Cleanup(func() { // after the parallel subtests
		var sb strings.Builder
		fmt.Fprintf(&sb, "stored after the fault (5,000 messages each; direct = topic unload, others = kill -9 proxy):\n%s\n", crashHeader)
		for _, r := range results {
			fmt.Fprintf(&sb, "%s\n", r)
		}
		t.Log(sb.String())
	})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runCrashCase(t, b, tc, proxyCrash{b})
			mu.Lock()
			results = append(results, r)
			mu.Unlock()
			r.check(t)
		})
	}
}

// crashRule is the proxy's policies section for the crash tests: one rule for namespace ns;
// regions are the admitted values of the properties policy's restricted key "region". Keys
// cycle on every message, so coalesce and properties merge across keys (split_keys: false):
// the faults must land on entries the proxy merged and cut.
func crashRule(ns, policy, regions string) string {
	rule := fmt.Sprintf("  - topics: %s/*\n    policy: %s\n", ns, policy)
	switch policy {
	case "coalesce":
		rule += "    max_delay: 5ms\n    split_keys: false\n"
	case "properties":
		rule += "    max_delay: 5ms\n    split_keys: false\n    restricted: {region: [" + regions + "]}\n"
	case "buckets":
		rule += "    max_delay: 5ms\n    buckets: 4\n"
	}
	return rule
}

// crashFault is how a crash case's path is broken mid-stream. The case sends with a pause of
// gap after every tenth message and holds its last 40% back until the fault has landed.
// Which goroutine: the case's test goroutine calls every method.
type crashFault interface {
	// begin is called once the case is set up, before its first send.
	begin(t *testing.T)
	// gap is the pause after every tenth send (0: none).
	gap() time.Duration
	// at is how many acknowledged messages of n trigger inject.
	at(n int) int64
	// inject breaks the path (pp is nil for a direct case) and returns once it is broken.
	inject(t *testing.T, pp *harness.ProcessProxy, topic string)
	// mend restores the path, after the held-back sends have been handed to the client.
	mend(t *testing.T, pp *harness.ProcessProxy)
}

// proxyCrash is TestKill9ProxyMidStreamStoresEveryMessageOnce's fault: the case's own proxy is
// killed with SIGKILL once 30% are acknowledged and started again on its port a second later;
// a direct case has its topic unloaded instead.
type proxyCrash struct{ b *harness.Broker }

func (proxyCrash) begin(*testing.T)   {}
func (proxyCrash) gap() time.Duration { return 0 }
func (proxyCrash) at(n int) int64     { return int64(n * 3 / 10) }

func (f proxyCrash) inject(t *testing.T, pp *harness.ProcessProxy, topic string) {
	if pp != nil {
		pp.Kill9()
		return
	}
	if err := f.b.UnloadTopic(ctxT(t, 30*time.Second), topic); err != nil {
		t.Fatal(err)
	}
}

func (proxyCrash) mend(t *testing.T, pp *harness.ProcessProxy) {
	if pp == nil {
		return
	}
	time.Sleep(time.Second)
	start := time.Now()
	if fails := pp.StartRetrying(90 * time.Second); fails > 0 {
		// The restart-on-the-same-port bug has its own test
		// (TestProxyRestartsOnSamePortAfterKill9); here it only lengthens the outage.
		t.Logf("restart: %d attempts failed with \"address already in use\"; outage %.1f s instead of 1 s",
			fails, time.Since(start).Seconds()+1)
	}
}

func runCrashCase(t *testing.T, b *harness.Broker, tc crashCase, fault crashFault) crashResult {
	const n = 5000
	res := crashResult{name: tc.name, lastSeqAfter: -2}
	region := crashRegion
	if tc.keyBased {
		// One region per key, so every key batch is one property group and the policy can
		// merge it whole (a mixed key batch has one sequence id and is forwarded as built).
		region = func(i int) string { return []string{"us", "eu", "ap"}[(i%16)%3] }
	}
	ns := newNamespace(t, b, "crash")
	if err := b.SetNamespaceDeduplication(ctxT(t, 30*time.Second), ns, true); err != nil {
		t.Fatal(err)
	}
	topic := "persistent://" + ns + "/t"
	// A durable subscription keeps every ledger: without one (and without retention) the broker
	// deletes the ledger the unload closes, and the check below would miss its messages.
	keep, err := newClient(t, b.ServiceURL).Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "keep",
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
	if err != nil {
		t.Fatal(err)
	}
	keep.Close()
	url := b.ServiceURL
	var pp *harness.ProcessProxy
	if tc.policy != "" {
		pp = harness.StartProcessProxy(t, b, "policies:\n"+crashRule(ns, tc.policy, "us, eu"))
		url = pp.URL()
	}

	c, err := pulsar.NewClient(pulsar.ClientOptions{URL: url, Logger: quietLogger(), OperationTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	opts := pulsar.ProducerOptions{
		Topic: topic, Name: "crash-" + strings.ReplaceAll(tc.name, "/", "-"),
		DisableBatching: !tc.batching, BatchingMaxPublishDelay: 5 * time.Millisecond,
		MaxPendingMessages: 2000, SendTimeout: 3 * time.Minute,
	}
	if tc.keyBased {
		opts.BatcherBuilderType = pulsar.KeyBasedBatchBuilder
	}
	prod, err := c.CreateProducer(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()

	var acked, sent, failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	sendCtx := ctxT(t, 5*time.Minute)
	// The sender holds its last 40% until the fault has been injected, so the fault always
	// lands mid-stream however fast the broker acknowledges (an unload's HTTP call can take
	// longer than sending everything).
	faulted := make(chan struct{})
	fault.begin(t)
	gap := fault.gap()
	wg.Add(n)
	go func() {
		for i := 0; i < n; i++ {
			if i == n*6/10 {
				select {
				case <-faulted:
				case <-sendCtx.Done():
				}
			}
			if gap > 0 && i%10 == 9 {
				time.Sleep(gap)
			}
			msg := &pulsar.ProducerMessage{Payload: []byte("m-" + strconv.Itoa(i)), Key: "k" + strconv.Itoa(i%16),
				Properties: map[string]string{"i": strconv.Itoa(i), "region": region(i)}}
			prod.SendAsync(sendCtx, msg, func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				} else {
					acked.Add(1)
				}
				wg.Done()
			})
			sent.Add(1)
		}
	}()

	// The fault, with up to MaxPendingMessages in flight.
	for acked.Load() < fault.at(n) {
		if failed.Load() > 0 {
			t.Fatalf("send failed before the fault: %v", firstErr.Load())
		}
		if err := sendCtx.Err(); err != nil {
			t.Fatalf("only %d of %d acknowledged before the fault: %v", acked.Load(), n, err)
		}
		time.Sleep(200 * time.Microsecond)
	}
	fault.inject(t, pp, topic)
	res.ackedAtFault, res.sentAtFault = acked.Load(), sent.Load()
	close(faulted)
	if res.ackedAtFault >= n {
		t.Fatalf("every message was acknowledged before the fault: the crash did not land mid-stream")
	}
	fault.mend(t, pp)

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(4 * time.Minute):
		t.Fatalf("after the fault only %d acknowledged, %d failed of %d", acked.Load(), failed.Load(), n)
	}
	res.sendErrors = int(failed.Load())
	if res.sendErrors > 0 {
		t.Logf("%d sends failed, first: %v", res.sendErrors, firstErr.Load())
	}

	entries, err := b.StoredEntries(ctxT(t, 2*time.Minute), topic)
	if err != nil {
		t.Fatal(err)
	}
	res.entries = len(entries)
	t.Logf("topic %s: %d entries read", topic, len(entries))
	counts := make([]int, n)
	for _, e := range entries {
		group := ""
		for j, m := range e.Messages {
			res.stored++
			i, err := strconv.Atoi(strings.TrimPrefix(string(m.Payload), "m-"))
			if err != nil || i < 0 || i >= n {
				t.Fatalf("entry %d:%d record %d: payload %q is not one of ours", e.Ledger, e.Entry, j, m.Payload)
			}
			counts[i]++
			if !m.HasSequence || m.SequenceID != uint64(i) {
				res.wrongSeq++
			}
			if tc.policy == "properties" {
				g := ""
				if r := region(i); r == "us" || r == "eu" {
					g = "region=" + r
				}
				if j == 0 {
					group = g
				} else if g != group {
					res.mixedEntries++
					group = "(mixed)"
				}
			}
		}
		if tc.policy == "properties" && mapString(e.Properties) != group {
			res.mixedEntries++
		}
	}
	for _, k := range counts {
		switch {
		case k == 0:
			res.missing++
		default:
			res.distinct++
			res.duplicates += k - 1
		}
	}
	if pp != nil {
		t.Logf("proxy metrics after restart:\n%s", pp.MetricsText("rebatchproxy_rebatch_entries_total"))
		res.lastSeqAfter = lastLoggedSequenceID(pp)
	}
	t.Logf("%s\n%s", crashHeader, res)
	return res
}
