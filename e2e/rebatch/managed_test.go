package rebatch_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/rebatchproxy/rebatchproxy/e2e/drivers"
	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/rebatch"
	"github.com/rebatchproxy/rebatchproxy/route"
)

// The proxy-managed Key_Shared spec: default (AUTO_SPLIT) consumers of four clients, through
// the proxy on a buckets topic, get whole buckets; directly they do not.

// managedGot is one message a consumer received: its payload index and redelivery count.
type managedGot struct {
	consumer string
	i        int
	redeliv  int
}

// managedConsumers are the spec's consumers: released clients run as drivers, and
// pulsar-client-go (this module's, the latest) in process, which the spec can start and
// close mid-stream.
type managedConsumers struct {
	t      *testing.T
	url    string
	topic  string
	mu     sync.Mutex
	got    []managedGot
	runs   map[string]*drivers.ConsumeRun
	inproc map[string]func()
}

func newManagedConsumers(t *testing.T, url, topic string) *managedConsumers {
	return &managedConsumers{t: t, url: url, topic: topic, runs: map[string]*drivers.ConsumeRun{}, inproc: map[string]func(){}}
}

// startDriver subscribes a released client's default Key_Shared consumer named name; it runs
// until it has seen nothing for 30 s.
func (mc *managedConsumers) startDriver(d *drivers.Driver, name string) {
	t := mc.t
	t.Helper()
	run, err := d.StartConsume(context.Background(), drivers.ConsumeSpec{URL: mc.url, Topic: mc.topic, Subscription: "ks",
		Type: "key_shared", ConsumerName: name, Idle: 30 * time.Second, Timeout: 5 * time.Minute})
	if err != nil {
		t.Fatalf("%s (%s): %v", name, d.Name, err)
	}
	mc.runs[name] = run
}

// startGo subscribes an in-process default Key_Shared consumer; stop closes it.
func (mc *managedConsumers) startGo(name string) {
	t := mc.t
	t.Helper()
	c, err := newClient(t, mc.url).Subscribe(pulsar.ConsumerOptions{Topic: mc.topic, SubscriptionName: "ks", Type: pulsar.KeyShared,
		Name: name, SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// midEntry: the last message taken came from a batch entry whose later messages are
		// still queued. The broker acknowledges an entry only when every message of it is
		// acknowledged (no batch-index acks), so a consumer that closed mid-entry would have
		// the whole entry redelivered to another consumer, messages it already took included:
		// Pulsar's at-least-once on a consumer's departure, the same directly or through the
		// proxy. A consumer leaving gracefully finishes the entry it is in, then closes.
		midEntry := false
		take := func(m pulsar.ConsumerMessage) {
			i, err := strconv.Atoi(strings.TrimRight(strings.TrimPrefix(string(m.Payload()), "msg-"), "."))
			if err != nil {
				i = -1
			}
			mc.mu.Lock()
			mc.got = append(mc.got, managedGot{consumer: name, i: i, redeliv: int(m.RedeliveryCount())})
			mc.mu.Unlock()
			_ = c.Ack(m)
			id := m.ID()
			midEntry = id.BatchSize() > 1 && id.BatchIdx() < id.BatchSize()-1
		}
		for {
			select {
			case m := <-c.Chan():
				take(m)
			case <-done:
				// The rest of an entry is queued already (an entry arrives whole).
				limit := time.After(10 * time.Second)
				for midEntry {
					select {
					case m := <-c.Chan():
						take(m)
					case <-limit:
						t.Errorf("%s: the rest of its batch entry did not arrive within 10 s", name)
						return
					}
				}
				return
			}
		}
	}()
	mc.inproc[name] = func() { close(done); wg.Wait(); c.Close() }
}

// stopGo closes an in-process consumer (a consumer leaving mid-stream).
func (mc *managedConsumers) stopGo(name string) {
	if stop := mc.inproc[name]; stop != nil {
		stop()
		delete(mc.inproc, name)
	}
}

// wait ends every consumer (the drivers by idleness) and returns all deliveries.
func (mc *managedConsumers) wait() []managedGot {
	t := mc.t
	for name := range mc.inproc {
		mc.stopGo(name)
	}
	for name, run := range mc.runs {
		res, err := run.Wait()
		if err != nil && res == nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err != nil {
			t.Logf("%s ended with %v (stderr tail: %s)", name, err, tail(res.Stderr, 600))
		}
		t.Logf("%s received %d", name, len(res.Messages))
		for _, m := range res.Messages {
			mc.got = append(mc.got, managedGot{consumer: name, i: m.I, redeliv: m.Redelivery})
		}
	}
	return mc.got
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// managedKeys returns n keys over 2,000: UTF-8 ones, a fifth invalid UTF-8, and one message in
// twenty keyless ("" here: pulsar-client-go sends no key for it).
func managedKeys(n int) []string { return randomKeys(11, 2000, 5, 20, n) }

// consumerRanges reads, from the broker's topic stats, each consumer's hash ranges in
// subscription "ks", by consumer name.
func consumerRanges(t *testing.T, b *harness.Broker, topic string) map[string][][2]int {
	t.Helper()
	st, err := b.Subscription(ctxT(t, 30*time.Second), topic, "ks")
	if err != nil {
		t.Fatalf("topic stats: %v", err)
	}
	out := map[string][][2]int{}
	for _, c := range st.Consumers {
		for _, r := range c.KeyHashRanges {
			if len(r) == 2 {
				out[c.ConsumerName] = append(out[c.ConsumerName], [2]int{r[0], r[1]})
			}
		}
	}
	return out
}

// settledRanges waits until the stats show exactly the named consumers, each with ranges,
// covering every hash once, and returns them.
func settledRanges(t *testing.T, b *harness.Broker, topic string, names ...string) map[string][][2]int {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		rs := consumerRanges(t, b, topic)
		covered := 0
		for _, r := range rs {
			for _, x := range r {
				covered += x[1] - x[0] + 1
			}
		}
		ok := len(rs) == len(names) && covered >= route.FullRange-1 // AUTO_SPLIT covers [1, 65535]
		for _, n := range names {
			ok = ok && len(rs[n]) > 0
		}
		if ok {
			return rs
		}
		if time.Now().After(deadline) {
			t.Errorf("consumer ranges did not settle on %v within a minute: %v", names, rs)
			return rs
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitConsumed waits until subscription "ks" has nothing left to deliver or acknowledge, so
// consumers closed afterwards take nothing with them.
func waitConsumed(t *testing.T, b *harness.Broker, topic string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, err := b.Subscription(ctxT(t, 30*time.Second), topic, "ks")
		if err != nil {
			t.Fatalf("topic stats: %v", err)
		}
		if st.MsgBacklog == 0 && st.UnackedMessages == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("subscription still has a backlog after 2 minutes: %d in backlog, %d unacknowledged", st.MsgBacklog, st.UnackedMessages)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func owns(ranges [][2]int, slot int) bool {
	for _, r := range ranges {
		if slot >= r[0] && slot <= r[1] {
			return true
		}
	}
	return false
}

// managedRun is what the spec counts.
type managedRun struct {
	received, distinct, lost, duplicates, redelivered int
	wrongOwner                                        int            // keyed deliveries to a consumer owning the key in no snapshot it appears in
	outOfOrder                                        int            // a consumer received a key's message after a later one of that key
	interleaved                                       int            // keys whose deliveries, in send order, change consumer more often than there were rebalances
	dupPairs                                          map[string]int // "first>again" consumer pairs of duplicate deliveries
}

// judge counts a run's deliveries against the broker's assignments (snapshots: the ranges
// each consumer held in each phase; slot gives a key's slot under the subscription's mode).
func judge(got []managedGot, keys []string, snapshots []map[string][][2]int, slot func(string) int, rebalances int) managedRun {
	var r managedRun
	seen := make([]int, len(keys))
	last := map[string]map[string]int{} // consumer -> key -> last i
	byKey := map[string][]managedGot{}
	for _, g := range got {
		if g.i < 0 || g.i >= len(keys) {
			continue
		}
		r.received++
		seen[g.i]++
		if g.redeliv > 0 {
			r.redelivered++
		}
		k := keys[g.i]
		if k == "" {
			continue // keyless: the broker routes it by the fallback key the proxy stamped
		}
		owned := false
		for _, s := range snapshots {
			owned = owned || owns(s[g.consumer], slot(k))
		}
		if !owned {
			r.wrongOwner++
		}
		if last[g.consumer] == nil {
			last[g.consumer] = map[string]int{}
		}
		if p, ok := last[g.consumer][k]; ok && g.i < p {
			r.outOfOrder++
		}
		last[g.consumer][k] = g.i
		byKey[k] = append(byKey[k], g)
	}
	firstAt := map[int]string{}
	pairs := map[string]int{}
	for _, g := range got {
		if g.i < 0 || g.i >= len(keys) {
			continue
		}
		if c, ok := firstAt[g.i]; ok {
			pairs[c+">"+g.consumer]++
		} else {
			firstAt[g.i] = g.consumer
		}
	}
	r.dupPairs = pairs
	for _, n := range seen {
		switch {
		case n == 0:
			r.lost++
		case n > 1:
			r.duplicates += n - 1
		}
		if n > 0 {
			r.distinct++
		}
	}
	for _, gs := range byKey {
		if consumerChanges(gs, func(g managedGot) int { return g.i }, func(g managedGot) string { return g.consumer }) > rebalances {
			r.interleaved++
		}
	}
	return r
}

// emptyKey stands for the present-but-empty key "" in the specs' key lists, where "" means
// keyless.
const emptyKey = "\x00empty"

// stickySlotOf and autoSplitSlotOf are a key's slot under STICKY and AUTO_SPLIT, the key read
// as the broker reads a partition key (emptyKey is "").
func stickySlotOf(k string) int {
	if k == emptyKey {
		k = ""
	}
	return route.StickySlot(route.StickyKey(route.KeyFields{PartitionKey: k, HasPartitionKey: true}))
}

func autoSplitSlotOf(k string) int {
	if k == emptyKey {
		k = ""
	}
	return route.ConsistentHashingSlot(route.StickyKey(route.KeyFields{PartitionKey: k, HasPartitionKey: true}))
}

// managedWorkload is the spec's 10,000 messages: 0..1999 from a Java 2.10.6 producer over 40
// keys, one of them the empty key (Java's .key("")), the rest from pulsar-client-go over 2,000
// keys (a fifth invalid UTF-8, one message in twenty keyless).
func managedWorkload() (keys []string, javaN, javaKeys int) {
	javaN, javaKeys = 2000, 40
	keys = make([]string, javaN, 10000)
	for i := range keys {
		if k := i % javaKeys; k == 0 {
			keys[i] = emptyKey
		} else {
			keys[i] = "key-" + strconv.Itoa(k)
		}
	}
	return append(keys, managedKeys(10000-javaN)...), javaN, javaKeys
}

// startJava runs the Java 2.10.6 producer (default batching) of managedWorkload in the
// background; the returned func waits for it.
func startJava(t *testing.T, d *drivers.Driver, url, topic string, n, keys int) func() {
	done := make(chan error, 1)
	go func() {
		res, err := d.Produce(context.Background(), drivers.ProduceSpec{URL: url, Topic: topic, Count: n,
			KeyMode: "seq", Keys: keys, EmptyKey: true, Timeout: 3 * time.Minute})
		if err == nil && len(res.Acks) != n {
			err = fmt.Errorf("%d acks for %d messages", len(res.Acks), n)
		}
		done <- err
	}()
	return func() {
		if err := <-done; err != nil {
			t.Fatalf("java-2.10.6 producer: %v", err)
		}
	}
}

// Given a topic under buckets (8 buckets, manage_key_shared on by default) and a Key_Shared
// subscription with default settings (AUTO_SPLIT) of four consumers, one each of
// pulsar-client-go v0.8.1, Java 2.10.6, Python 3.1.0 and pulsar-client-go v0.21.0, all
// through the proxy,
// when batching producers (pulsar-client-go, Java 2.10.6) send 10,000 messages over 2,040 keys
// (invalid UTF-8, empty and absent keys included) while a fifth consumer joins after the first
// third and one consumer leaves after the second (at an entry boundary, as a graceful consumer does),
// then every keyed message reaches the consumer whose STICKY ranges (as the broker's stats
// show them) hold its key, keys move only at the two rebalances, per-key order holds, nothing
// is lost and nothing is delivered twice; while the same four consumers subscribed directly
// receive keys they do not own (the control).
func TestManagedKeySharedGivesDefaultConsumersWholeBuckets(t *testing.T) {
	b := harness.Default(t)
	keys, javaN, javaKeys := managedWorkload()
	olds := map[string]*drivers.Driver{}
	oldNames := []string{"go-v0.8.1", "java-2.10.6", "python-3.1.0"}
	for _, name := range oldNames {
		olds[name] = preparedDriver(t, name)
	}

	// The control: directly, four default consumers and the batching producers.
	{
		ns := newNamespace(t, b, "managed-direct")
		topic := "persistent://" + ns + "/t"
		cs := newManagedConsumers(t, b.ServiceURL, topic)
		for _, n := range oldNames {
			cs.startDriver(olds[n], n)
		}
		cs.startGo("go-latest")
		snap := settledRanges(t, b, topic, append(oldNames, "go-latest")...)
		java := startJava(t, olds["java-2.10.6"], b.ServiceURL, topic, javaN, javaKeys)
		prod, err := newClient(t, b.ServiceURL).CreateProducer(pulsar.ProducerOptions{Topic: topic, BatchingMaxPublishDelay: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		sendKeyed(t, prod, keys, javaN, len(keys), "msg-")
		prod.Close()
		java()
		waitConsumed(t, b, topic)
		r := judge(cs.wait(), keys, []map[string][][2]int{snap}, autoSplitSlotOf, 0)
		t.Logf("direct:        %d received (%d distinct of %d), %d to a consumer not owning the key, %d keys moved between consumers, %d out of key order, %d lost, %d duplicates",
			r.received, r.distinct, len(keys), r.wrongOwner, r.interleaved, r.outOfOrder, r.lost, r.duplicates)
		if r.wrongOwner == 0 {
			t.Errorf("directly no message reached a consumer not owning its key: the workload shows nothing")
		}
	}

	// Through the proxy.
	ns := newNamespace(t, b, "managed")
	topic := "persistent://" + ns + "/t"
	url := startProxy(t, b, ns, rebatch.Policy{Kind: rebatch.Buckets, Buckets: 8, MaxDelay: 5 * time.Millisecond})
	cs := newManagedConsumers(t, url, topic)
	for _, n := range oldNames {
		cs.startDriver(olds[n], n)
	}
	cs.startGo("go-latest")
	phase1 := settledRanges(t, b, topic, append(oldNames, "go-latest")...)
	java := startJava(t, olds["java-2.10.6"], url, topic, javaN, javaKeys)
	prod, err := newClient(t, url).CreateProducer(pulsar.ProducerOptions{Topic: topic, BatchingMaxPublishDelay: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	third := (len(keys) - javaN) / 3
	sendKeyed(t, prod, keys, javaN, javaN+third, "msg-")
	cs.startGo("go-joiner")
	phase2 := settledRanges(t, b, topic, append(oldNames, "go-latest", "go-joiner")...)
	sendKeyed(t, prod, keys, javaN+third, javaN+2*third, "msg-")
	cs.stopGo("go-latest")
	phase3 := settledRanges(t, b, topic, append(oldNames, "go-joiner")...)
	sendKeyed(t, prod, keys, javaN+2*third, len(keys), "msg-")
	prod.Close()
	java()
	waitConsumed(t, b, topic)
	t.Logf("broker's ranges: 4 consumers %v; a fifth joined %v; one left %v", phase1, phase2, phase3)

	r := judge(cs.wait(), keys, []map[string][][2]int{phase1, phase2, phase3}, stickySlotOf, 2)
	t.Logf("through proxy: %d received (%d distinct of %d), %d to a consumer not owning the key, %d keys moved more often than the 2 rebalances, %d out of key order, %d lost, %d duplicates (%d redeliveries)",
		r.received, r.distinct, len(keys), r.wrongOwner, r.interleaved, r.outOfOrder, r.lost, r.duplicates, r.redelivered)
	if r.duplicates > 0 {
		t.Logf("duplicate deliveries (first consumer>again at): %v", r.dupPairs)
	}
	if r.wrongOwner != 0 || r.interleaved != 0 || r.outOfOrder != 0 || r.lost != 0 || r.duplicates != 0 {
		t.Fatalf("through the proxy: want 0 wrong owners, 0 interleaved keys, 0 out of order, 0 lost, 0 duplicates")
	}
}

// Given a topic under buckets (4 buckets, manage_key_shared on by default) and two default
// Key_Shared consumers of pulsar-rs through the proxy, a client that, told by CLOSE_CONSUMER to
// resubscribe, first closes the consumer id itself (the other drivers' clients just subscribe
// again),
// when the second consumer's arrival releases the first, a batching producer then sends 3,000
// messages over 2,000 UTF-8 keys (one message in twenty keyless), and a third consumer
// (pulsar-client-go) joins after the first half,
// then the consumers settle on whole-bucket ranges both times (a released consumer's own close
// keeps its place; when it did not, the two handed the buckets back and forth and received
// nothing), every keyed message reaches the consumer whose ranges hold its key, keys move only
// at the join, per-key order holds, and nothing is lost or delivered twice.
func TestManagedKeySharedWithAClientThatClosesBeforeResubscribing(t *testing.T) {
	b := harness.Default(t)
	rs := preparedDriver(t, "rust-6.9.1")
	ns := newNamespace(t, b, "managed-rust")
	topic := "persistent://" + ns + "/t"
	url := startProxy(t, b, ns, rebatch.Policy{Kind: rebatch.Buckets, Buckets: 4, MaxDelay: 5 * time.Millisecond})
	cs := newManagedConsumers(t, url, topic)
	cs.startDriver(rs, "rust-a")
	settledRanges(t, b, topic, "rust-a")
	cs.startDriver(rs, "rust-b")
	phase1 := settledRanges(t, b, topic, "rust-a", "rust-b")
	// UTF-8 keys only: pulsar-rs fails a whole batch whose message metadata holds a key that is
	// not UTF-8 ("Error decoding batched messages"), directly as through the proxy.
	keys := randomKeys(12, 2000, 0, 20, 3000)
	prod, err := newClient(t, url).CreateProducer(pulsar.ProducerOptions{Topic: topic, BatchingMaxPublishDelay: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sendKeyed(t, prod, keys, 0, len(keys)/2, "msg-")
	cs.startGo("go-joiner")
	phase2 := settledRanges(t, b, topic, "rust-a", "rust-b", "go-joiner")
	sendKeyed(t, prod, keys, len(keys)/2, len(keys), "msg-")
	prod.Close()
	waitConsumed(t, b, topic)
	t.Logf("broker's ranges: two pulsar-rs consumers %v; a third joined %v", phase1, phase2)

	r := judge(cs.wait(), keys, []map[string][][2]int{phase1, phase2}, stickySlotOf, 1)

	t.Logf("through proxy: %d received (%d distinct of %d), %d to a consumer not owning the key, %d keys moved more often than the rebalance, %d out of key order, %d lost, %d duplicates",
		r.received, r.distinct, len(keys), r.wrongOwner, r.interleaved, r.outOfOrder, r.lost, r.duplicates)
	if r.wrongOwner != 0 || r.interleaved != 0 || r.outOfOrder != 0 || r.lost != 0 || r.duplicates != 0 {
		t.Fatalf("want 0 wrong owners, 0 interleaved keys, 0 out of order, 0 lost, 0 duplicates")
	}
}

// Given a buckets topic reached through two proxy instances, and a default Key_Shared
// consumer subscribed through the first (the proxy gives it every bucket),
// when a second default consumer of the same subscription subscribes through the second proxy,
// then the broker refuses its overlapping STICKY range and the client's subscribe fails with
// that error (after the proxy's retries), while the first consumer keeps receiving everything.
func TestManagedKeySharedSubscriptionIsOwnedByOneProxy(t *testing.T) {
	b := harness.Default(t)
	ns := newNamespace(t, b, "managed-two")
	topic := "persistent://" + ns + "/t"
	pol := rebatch.Policy{Kind: rebatch.Buckets, Buckets: 4, MaxDelay: 5 * time.Millisecond}
	url1, url2 := startProxy(t, b, ns, pol), startProxy(t, b, ns, pol)
	first := newManagedConsumers(t, url1, topic)
	first.startGo("via-first")
	settledRanges(t, b, topic, "via-first")

	start := time.Now()
	c, err := newClient(t, url2).Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "ks", Type: pulsar.KeyShared, Name: "via-second"})
	t.Logf("subscribe through the second proxy after %v: %v", time.Since(start).Round(time.Millisecond), err)
	if err == nil {
		c.Close()
		t.Fatalf("a second proxy's consumer joined the subscription; the broker should refuse its overlapping range")
	}
	keys := managedKeys(500)
	prod, err := newClient(t, url1).CreateProducer(pulsar.ProducerOptions{Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	sendKeyed(t, prod, keys, 0, len(keys), "msg-")
	prod.Close()
	waitConsumed(t, b, topic)
	r := judge(first.wait(), keys, []map[string][][2]int{{"via-first": {{0, route.FullRange - 1}}}}, stickySlotOf, 0)
	t.Logf("first proxy's consumer: %d received (%d distinct of %d), %d lost, %d duplicates", r.received, r.distinct, len(keys), r.lost, r.duplicates)
	if r.lost != 0 || r.duplicates != 0 || r.wrongOwner != 0 {
		t.Fatalf("the first proxy's consumer lost %d, got %d twice, %d not its own", r.lost, r.duplicates, r.wrongOwner)
	}
}
