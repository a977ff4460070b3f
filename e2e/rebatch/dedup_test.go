package rebatch_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/rebatchproxy/rebatchproxy/e2e/drivers"
	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/proxy"
	"github.com/rebatchproxy/rebatchproxy/rebatch"
	"github.com/rebatchproxy/rebatchproxy/route"
)

// dedupPaths are the ways a producer reaches the broker in these tests: directly, and through
// the proxy under each policy.
var dedupPaths = []string{"direct", "passthrough", "coalesce", "properties", "buckets"}

// dedupPolicy is the policy of a proxied path. properties restricts region to 0, 1 and 2 (3
// and 4 are not admitted, so their group is empty). coalesce and properties merge across keys
// (split_keys: false): the key batches of these clients hold one key each, and merging
// several of them into one entry is the numbering these tests are about.
func dedupPolicy(path string) rebatch.Policy {
	mixKeys := false
	switch path {
	case "coalesce":
		return rebatch.Policy{Kind: rebatch.Coalesce, MaxDelay: 5 * time.Millisecond, SplitKeys: &mixKeys}
	case "properties":
		return rebatch.Policy{Kind: rebatch.Properties, MaxDelay: 5 * time.Millisecond, SplitKeys: &mixKeys, Restricted: map[string][]string{"region": {"0", "1", "2"}}}
	case "buckets":
		return rebatch.Policy{Kind: rebatch.Buckets, MaxDelay: 5 * time.Millisecond, Buckets: 4}
	}
	return rebatch.Policy{Kind: rebatch.Passthrough}
}

// storedCount is what the broker stored for one run, read entry by entry.
type storedCount struct {
	path                     string
	acked, failed            int
	entries, stored          int
	distinct, lost, dups     int
	mixedGroups, multiBucket int // entries whose messages do not share a group / a bucket
	received                 int // distinct messages a consumer got through the same path; -1: not read
	asBuilt                  string
}

func (c storedCount) String() string {
	received := "-"
	if c.received >= 0 {
		received = strconv.Itoa(c.received)
	}
	return fmt.Sprintf("%-12s %6d %6d %7d %7d %8d %5d %5d %6.1f %6d %7d %8s  %s", c.path, c.acked, c.failed, c.entries, c.stored, c.distinct,
		c.lost, c.dups, float64(c.stored)/float64(max(c.entries, 1)), c.mixedGroups, c.multiBucket, received, c.asBuilt)
}

// policyKept reports whether the stored entries do what the path's policy promises: one
// property group per entry under properties, one bucket per entry under buckets.
func (c storedCount) policyKept() bool {
	return !(c.path == "properties" && c.mixedGroups > 0) && !(c.path == "buckets" && c.multiBucket > 0)
}

const storedHeader = "path          acked failed entries  stored distinct  lost  dups msg/ent  mixed  multi-b received  sends as built"

// driverIndex reads a driver payload ("msg-<i>" padded with dots).
func driverIndex(payload []byte) (int, bool) {
	i, err := strconv.Atoi(strings.TrimRight(strings.TrimPrefix(string(payload), "msg-"), "."))
	return i, err == nil
}

// countStored reads every stored entry of topic and counts messages 0..n-1.
func countStored(t *testing.T, b *harness.Broker, topic string, n int, path string, group func(i int) string) (storedCount, []int) {
	t.Helper()
	c := storedCount{path: path}
	entries, err := b.StoredEntries(ctxT(t, 2*time.Minute), topic)
	if err != nil {
		t.Fatal(err)
	}
	ring, _ := route.NewEqualBuckets(4)
	copies := make([]int, n)
	c.entries = len(entries)
	for _, e := range entries {
		groups, buckets := map[string]bool{}, map[int]bool{}
		for _, m := range e.Messages {
			i, ok := driverIndex(m.Payload)
			if !ok || i < 0 || i >= n {
				t.Fatalf("entry %d:%d: payload %q is not one of ours", e.Ledger, e.Entry, m.Payload)
			}
			c.stored++
			copies[i]++
			groups[group(i)] = true
			buckets[ring.Bucket(route.HashB([]byte(m.PartitionKey)))] = true
		}
		if len(groups) > 1 || (path == "properties" && len(e.Messages) > 0 && mapString(e.Properties) != group(mustIndex(e.Messages[0].Payload))) {
			c.mixedGroups++
		}
		if len(buckets) > 1 {
			c.multiBucket++
		}
	}
	for _, k := range copies {
		if k == 0 {
			c.lost++
		} else {
			c.distinct++
			c.dups += k - 1
		}
	}
	return c, copies
}

func mustIndex(p []byte) int { i, _ := driverIndex(p); return i }

// receiveDistinct reads topic from the start through url until n distinct driver messages or a quiet
// second, and returns how many distinct ones arrived.
func receiveDistinct(t *testing.T, url, topic string, n int) int {
	t.Helper()
	cons, err := newClient(t, url).Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "check",
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	seen := make([]bool, n)
	got := 0
	for got < n {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		m, err := cons.Receive(ctx)
		cancel()
		if err != nil {
			break
		}
		_ = cons.Ack(m)
		if i, ok := driverIndex(m.Payload()); ok && i >= 0 && i < n && !seen[i] {
			seen[i] = true
			got++
		}
	}
	return got
}

// asBuiltMetrics returns the proxy's sends_as_built counters, e.g. "numbering=3".
func asBuiltMetrics(t *testing.T, m *proxy.RebatchMetrics) string {
	var parts []string
	for _, reason := range []string{"numbering", "out_of_order", "resend_cut_differently"} {
		if v, _ := harness.MetricSum(t, m.Collectors(), "rebatchproxy_rebatch_sends_as_built_total", "reason", reason); v > 0 {
			parts = append(parts, fmt.Sprintf("%s=%.0f", reason, v))
		}
	}
	return strings.Join(parts, ",")
}

// dedupRun sends spec through one path into a fresh namespace with broker de-duplication on.
// A driver that fails is fatal unless mayGiveUp: a client whose key-based batcher loses data
// with de-duplication on also gives up at times (pulsar-client-go v0.10.0's sends time out
// after the broker's "cannot determine" error, directly as through the proxy); what the broker
// stored is still counted, and the error is returned.
func dedupRun(t *testing.T, b *harness.Broker, d *drivers.Driver, path string, spec drivers.ProduceSpec, group func(int) string, mayGiveUp bool) (storedCount, []int, error) {
	t.Helper()
	ns := newNamespace(t, b, "dedup-"+path)
	if err := b.SetNamespaceDeduplication(ctxT(t, 30*time.Second), ns, true); err != nil {
		t.Fatal(err)
	}
	topic := "persistent://" + ns + "/t"
	url := b.ServiceURL
	var m *proxy.RebatchMetrics
	if path != "direct" {
		var px *harness.InProcessProxy
		px, m = startProxyServer(t, b, ns, dedupPolicy(path))
		url = px.URL
	}
	spec.URL, spec.Topic = url, topic
	res, produceErr := d.Produce(ctxT(t, 4*time.Minute), spec)
	if produceErr != nil && !mayGiveUp {
		t.Fatalf("%s produce: %v", path, produceErr)
	}
	c, copies := countStored(t, b, topic, spec.Count, path, group)
	if res != nil {
		c.acked, c.failed = res.Summary.Acked, res.Summary.Failed
	}
	c.received = receiveDistinct(t, url, topic, spec.Count)
	if m != nil {
		c.asBuilt = asBuiltMetrics(t, m)
	}
	return c, copies, produceErr
}

// preparedDriver returns the named driver, prepared (built or fetched) once per machine.
func preparedDriver(t *testing.T, name string) *drivers.Driver {
	t.Helper()
	d, err := drivers.ByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Prepare(ctxT(t, 5*time.Minute)); err != nil {
		t.Fatal(err)
	}
	return d
}

var updateDedup = flag.Bool("update-dedup", false, "write DEDUP.md from TestKeyBasedBatchersWithDeduplicationStoreEveryMessageOnce's run")

// keyBasedClients are the clients whose key-based batchers TestKeyBasedBatchersWith... drives:
// every pinned driver.
var keyBasedClients = []string{"go-v0.8.1", "go-v0.10.0", "go-v0.12.1", "go-v0.14.0", "go-v0.18.0", "go-v0.21.0",
	"java-2.10.6", "java-3.0.7", "java-4.0.13", "python-3.1.0", "python-3.13.0"}

// lossyKeyBatchers are the clients whose key-based batcher loses messages with de-duplication
// on even directly: pulsar-client-go before v0.14 sends a flush's key batches sorted by key
// string, so their sequence ids fall back (key-10 before key-2), and the broker drops every one
// numbered at or below an earlier one as a duplicate, and acknowledges it. The test asserts that
// loss directly, so a client that stops losing data shows up here; through the proxy, which
// judges such sends as a direct broker does (numbering.go), it asserts that nothing is stored
// twice and every send is answered.
var lossyKeyBatchers = map[string]bool{"go-v0.8.1": true, "go-v0.10.0": true, "go-v0.12.1": true}

// brokenKeyBatchers are not run: python-3.1.0's key-based batcher sends its key batches out of
// sequence-id order too (one numbered 0 after ones numbered up to 49), and directly, with
// de-duplication on, it either loses most messages (1,066 to 1,396 of 2,000 in five runs) or
// stops getting answers after the broker's "cannot determine whether the message is a
// duplicate" and blocks in send or flush until the driver's watchdog ends it (three of four
// direct runs in session 3); through the proxy it blocked the same way. Since rewriting policies
// hold out-of-order sends until the broker can judge them (rebatch/outoforder.go), four runs
// (session 5, run as a lossy client) did not block: directly 1,057 to 1,192 of 2,000 lost, under
// passthrough 866 to 1,146, coalesce 1,057 to 1,254, properties 872 to 1,470, buckets 685 to
// 1,024, never one stored twice; one of the four failed (not analysed), so it stays out of CI.
var brokenKeyBatchers = map[string]string{"python-3.1.0": "not run: the client loses data or hangs directly"}

// dedupTable renders DEDUP.md: one row per client, one cell per path.
func dedupTable(cells map[string]map[string]string) string {
	var sb strings.Builder
	sb.WriteString("<!-- Generated by TestKeyBasedBatchersWithDeduplicationStoreEveryMessageOnce; do not edit. Regenerate: go test ./e2e/rebatch -run TestKeyBasedBatchersWithDeduplication -count=1 -update-dedup -->\n")
	sb.WriteString("Key-based batching producers, broker de-duplication on, 2,000 messages over 50 keys each, against Apache Pulsar 4.0.8. " +
		"pass: every send acknowledged, every message stored exactly once and received once through the same path, and, under properties " +
		"and buckets, every entry one property group or one bucket. Clients whose key-based batcher loses data directly (their batches reach " +
		"the broker out of sequence-id order) are checked for no duplicates and every send answered (unless the client gives up, as it also does directly); why a client is not run is in dedup_test.go.\n\n")
	sb.WriteString("| client | " + strings.Join(dedupPaths, " | ") + " |\n|---|" + strings.Repeat("---|", len(dedupPaths)) + "\n")
	for _, name := range keyBasedClients {
		row := []string{name}
		for _, path := range dedupPaths {
			row = append(row, cells[name][path])
		}
		sb.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
	return sb.String()
}

// Given broker de-duplication on, and key-based batching producers of every pinned client
// (their batches number messages in ways the engine must not re-number freely), each sending
// 2,000 messages over 50 keys asynchronously (region = i mod 5, so every key's messages share
// one property group),
// when each sends directly and through the proxy under passthrough, coalesce, properties and
// buckets,
// then every send is acknowledged and every message is stored exactly once and received once
// through the same path, under every policy; properties entries hold one group each (stamped
// as their outer properties) and buckets entries one bucket each. For the clients that lose
// data directly (lossyKeyBatchers): the loss directly, and through the proxy every send answered
// and nothing stored twice; brokenKeyBatchers are not run. The run's table must equal DEDUP.md (-update-dedup writes it).
func TestKeyBasedBatchersWithDeduplicationStoreEveryMessageOnce(t *testing.T) {
	b := harness.Default(t)
	const n = 2000
	group := func(i int) string {
		if r := i % 5; r < 3 {
			return "region=" + strconv.Itoa(r)
		}
		return ""
	}
	var mu sync.Mutex
	var rows []string
	cells := map[string]map[string]string{}
	t.Cleanup(func() {
		t.Logf("key-based batchers, broker de-duplication on, %d messages over 50 keys each:\n%-14s %s\n%s", n, "client", storedHeader, strings.Join(rows, "\n"))
		got := dedupTable(cells)
		file := filepath.Join(harness.RepoRoot(), "e2e", "rebatch", "DEDUP.md")
		if *updateDedup {
			if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
				t.Error(err)
			}
			return
		}
		if want, err := os.ReadFile(file); err != nil || string(want) != got {
			t.Errorf("DEDUP.md differs from this run's table (regenerate with -update-dedup); this run:\n%s", got)
		}
	})
	for _, name := range keyBasedClients {
		t.Run(name, func(t *testing.T) {
			mu.Lock()
			cells[name] = map[string]string{}
			mu.Unlock()
			var d *drivers.Driver
			if _, broken := brokenKeyBatchers[name]; !broken {
				d = preparedDriver(t, name)
			}
			for _, path := range dedupPaths {
				if why, broken := brokenKeyBatchers[name]; broken {
					cells[name][path] = why
					continue
				}
				isLossy := lossyKeyBatchers[name]
				spec := drivers.ProduceSpec{Count: n, Batcher: "key-based", KeyMode: "seq", Keys: 50,
					Properties: "i={i},region={i%5}", BatchDelay: drivers.Int(10), Timeout: 3 * time.Minute}
				c, _, produceErr := dedupRun(t, b, d, path, spec, group, isLossy)
				t.Logf("%s\n%s", storedHeader, c)
				cell := "pass"
				switch {
				case isLossy && path == "direct":
					cell = "client loses data directly"
					if produceErr != nil {
						t.Logf("%s directly: the client gave up: %v", name, produceErr)
					}
					if c.lost == 0 && produceErr == nil {
						cell = "stored every message"
						t.Errorf("%s's key-based batcher stored every message directly: it no longer loses data with de-duplication on; check it like the others", name)
					}
				case isLossy:
					cell = "no duplicates; the client's losses"
					if produceErr != nil {
						// The client gave up, so not every send was answered to it; what
						// is checked is that nothing was stored twice.
						t.Logf("%s through %s: the client gave up (as it also does directly): %v", name, path, produceErr)
					}
					if (produceErr == nil && c.acked+c.failed != n) || c.dups != 0 || !c.policyKept() {
						cell = fmt.Sprintf("FAIL: %d answered, %d stored twice", c.acked+c.failed, c.dups)
						t.Errorf("%s: a lossy client's sends not all answered, or messages stored twice:\n%s\n%s", path, storedHeader, c)
					}
				case c.acked != n || c.failed != 0 || c.lost != 0 || c.dups != 0 || c.received != n:
					cell = fmt.Sprintf("FAIL: %d lost, %d stored twice", c.lost, c.dups)
					t.Errorf("%s: not every acknowledged message stored and received exactly once:\n%s\n%s", path, storedHeader, c)
				case !c.policyKept():
					cell = "FAIL: entries break the policy"
					t.Errorf("%s: entries do what the policy promises only partly:\n%s\n%s", path, storedHeader, c)
				}
				mu.Lock()
				cells[name][path] = cell
				rows = append(rows, fmt.Sprintf("%-14s %s", name, c))
				mu.Unlock()
			}
		})
	}
}

// Given broker de-duplication on and a Java producer (4.0.13 and 2.10.6) with its default
// batcher in batches of exactly 10, whose application sets the sequence ids itself and out of
// order (message i gets i*7919 mod 2000),
// when it sends 2,000 messages directly and through the proxy under every policy,
// then the proxy stores exactly the messages a direct connection stores (a direct broker drops
// every batch whose first id is not above the highest it recorded, and acknowledges it), and
// every send is acknowledged on every path; under buckets every message stored directly is
// stored, and a few more after a client reconnect (a known gap, see below).
func TestOutOfOrderApplicationIdsAreStoredAsDirectly(t *testing.T) {
	b := harness.Default(t)
	const n = 2000
	for _, name := range []string{"java-4.0.13", "java-2.10.6"} {
		t.Run(name, func(t *testing.T) {
			d := preparedDriver(t, name)
			var want []int
			var lines []string
			for _, path := range dedupPaths {
				spec := drivers.ProduceSpec{Count: n, KeyMode: "seq", Keys: 50, Properties: "i={i},region={i%5}",
					BatchMaxMessages: 10, BatchDelay: drivers.Int(60000), ExplicitSeq: true, SeqStart: 0, SeqScramble: true,
					Timeout: 3 * time.Minute}
				c, copies, _ := dedupRun(t, b, d, path, spec, func(int) string { return "" }, false)
				lines = append(lines, c.String())
				if path == "direct" {
					want = copies
					if c.distinct == 0 || c.distinct == n {
						t.Fatalf("direct stored %d of %d: the scrambled ids did not make the broker drop some batches", c.distinct, n)
					}
				} else if !slices.Equal(copies, want) {
					lost, extra := 0, 0
					for i := range copies {
						switch {
						case copies[i] < want[i]:
							lost++
						case copies[i] > want[i]:
							extra++
						}
					}
					t.Errorf("%s: %d messages stored directly are missing, %d stored that a direct broker drops", path, lost, extra)
				}
				if c.acked != n || c.failed != 0 || c.dups != 0 {
					t.Errorf("%s: acked %d failed %d dups %d of %d", path, c.acked, c.failed, c.dups, n)
				}
			}
			t.Logf("out-of-order application ids, de-duplication on (mixed/multi-b not checked here):\n%s\n%s", storedHeader, strings.Join(lines, "\n"))
		})
	}
}
