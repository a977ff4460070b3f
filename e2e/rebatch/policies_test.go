package rebatch_test

import (
	"fmt"
	"math/rand"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/rebatch"
)

// sendAll sends the messages asynchronously through p and returns the id the client was
// given for each, failing the test on any send error.
func sendAll(t *testing.T, p pulsar.Producer, msgs []*pulsar.ProducerMessage) []pulsar.MessageID {
	t.Helper()
	ctx := ctxT(t, 2*time.Minute)
	ids := make([]pulsar.MessageID, len(msgs))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for i, m := range msgs {
		i := i
		wg.Add(1)
		p.SendAsync(ctx, m, func(id pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
			defer wg.Done()
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("message %d: %w", i, err))
				mu.Unlock()
				return
			}
			ids[i] = id
		})
	}
	if err := p.FlushWithCtx(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d sends failed, first: %v", len(errs), errs[0])
	}
	return ids
}

// consumeAll reads n messages from the broker directly and checks they are exactly the
// payloads "m-0".."m-(n-1)" in order.
func consumeAll(t *testing.T, b *harness.Broker, topic string, n int, check func(i int, m pulsar.Message)) {
	t.Helper()
	cons := subscribeEarliest(t, b, topic)
	ctx := ctxT(t, time.Minute)
	for i := 0; i < n; i++ {
		m, err := cons.Receive(ctx)
		if err != nil {
			t.Fatalf("receive %d of %d: %v", i, n, err)
		}
		if got, want := string(m.Payload()), "m-"+strconv.Itoa(i); got != want {
			t.Fatalf("message %d is %q, want %q (order or exactly-once broken)", i, got, want)
		}
		if check != nil {
			check(i, m)
		}
		_ = cons.Ack(m)
	}
}

// group returns a message's restricted properties under PIP-191's example policy.
func group(props map[string]string) string {
	var parts []string
	if v := props["region"]; v == "us" || v == "eu" {
		parts = append(parts, "region="+v)
	}
	if v := props["version"]; v == "1" || v == "2" {
		parts = append(parts, "version="+v)
	}
	return strings.Join(parts, ",")
}

func mapString(m map[string]string) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// Given the proxy with the properties policy (region: us, eu; version: 1, 2) and a
// pulsar-client-go producer batching freely,
// when it sends 2,000 messages whose region and version vary at random, keyed in runs of 20,
// then every stored entry is a batch whose outer properties are exactly its messages' shared
// restricted properties, and a consumer receives every message once, in producer order, with
// its own properties and key.
func TestPropertiesPolicyStoresEntriesGroupedByRestrictedProperties(t *testing.T) {
	b := harness.Default(t)
	ns := newNamespace(t, b, "props")
	url := startProxy(t, b, ns, rebatch.Policy{Kind: rebatch.Properties,
		Restricted: map[string][]string{"region": {"us", "eu"}, "version": {"1", "2"}}})
	topic := "persistent://" + ns + "/t"
	const n = 2000
	rnd := rand.New(rand.NewSource(1))
	regions, versions := []string{"us", "eu", "ap", ""}, []string{"1", "2", "3", ""}
	msgs := make([]*pulsar.ProducerMessage, n)
	props := make([]map[string]string, n)
	for i := range msgs {
		p := map[string]string{"i": strconv.Itoa(i)}
		// Runs of equal values, as real traffic has, with random changes.
		if i == 0 || rnd.Intn(4) == 0 {
			if r := regions[rnd.Intn(len(regions))]; r != "" {
				p["region"] = r
			}
			if v := versions[rnd.Intn(len(versions))]; v != "" {
				p["version"] = v
			}
		} else {
			for _, k := range []string{"region", "version"} {
				if v, ok := props[i-1][k]; ok {
					p[k] = v
				}
			}
		}
		props[i] = p
		msgs[i] = &pulsar.ProducerMessage{Payload: []byte("m-" + strconv.Itoa(i)), Key: "k" + strconv.Itoa(i/20%50), Properties: p}
	}

	c := newClient(t, url)
	prod, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic, BatchingMaxPublishDelay: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sendAll(t, prod, msgs)
	prod.Close()

	entries, err := b.StoredEntries(ctxT(t, time.Minute), topic)
	if err != nil {
		t.Fatal(err)
	}
	next := 0
	for _, e := range entries {
		if !e.Batched {
			t.Fatalf("entry %d:%d is not in batch format", e.Ledger, e.Entry)
		}
		want := ""
		for j, m := range e.Messages {
			i, err := strconv.Atoi(m.Properties["i"])
			if err != nil || i != next {
				t.Fatalf("entry %d:%d record %d is message %q, want %d (order)", e.Ledger, e.Entry, j, m.Properties["i"], next)
			}
			next++
			if mapString(m.Properties) != mapString(props[i]) {
				t.Fatalf("message %d properties %v, sent %v", i, m.Properties, props[i])
			}
			if j == 0 {
				want = group(props[i])
			} else if g := group(props[i]); g != want {
				t.Fatalf("entry %d:%d mixes groups %q and %q", e.Ledger, e.Entry, want, g)
			}
		}
		if got := mapString(e.Properties); got != want {
			t.Fatalf("entry %d:%d outer properties %q, want its group %q", e.Ledger, e.Entry, got, want)
		}
	}
	if next != n {
		t.Fatalf("broker stored %d messages, sent %d", next, n)
	}
	t.Logf("%d messages stored in %d entries, each homogeneous in its restricted properties", n, len(entries))
	consumeAll(t, b, topic, n, func(i int, m pulsar.Message) {
		if mapString(m.Properties()) != mapString(props[i]) || m.Key() != "k"+strconv.Itoa(i/20%50) {
			t.Fatalf("consumed message %d: key %q properties %v", i, m.Key(), m.Properties())
		}
	})
}

// Given the proxy with the coalesce policy and a pulsar-client-go producer with batching off,
// when it sends 2,000 messages asynchronously, keyed in runs of 40,
// then the broker stores them in at least five times fewer entries, none mixing keys, every send's receipt
// names the entry that holds its message, and a consumer receives each once, in order.
func TestCoalescePolicyMergesUnbatchedSends(t *testing.T) {
	b := harness.Default(t)
	ns := newNamespace(t, b, "coalesce")
	url := startProxy(t, b, ns, rebatch.Policy{Kind: rebatch.Coalesce, MaxDelay: 5 * time.Millisecond})
	topic := "persistent://" + ns + "/t"
	const n = 2000
	msgs := make([]*pulsar.ProducerMessage, n)
	for i := range msgs {
		// Keys in runs of 40, as entity-keyed traffic often comes: entries never mix keys
		// (split_keys), so only runs merge.
		msgs[i] = &pulsar.ProducerMessage{Payload: []byte("m-" + strconv.Itoa(i)), Key: "k" + strconv.Itoa(i/40%7)}
	}
	c := newClient(t, url)
	prod, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true, MaxPendingMessages: 1000})
	if err != nil {
		t.Fatal(err)
	}
	ids := sendAll(t, prod, msgs)
	prod.Close()

	entries, err := b.StoredEntries(ctxT(t, time.Minute), topic)
	if err != nil {
		t.Fatal(err)
	}
	type pos struct{ l, e int64 }
	where := map[string]pos{}
	total := 0
	for _, e := range entries {
		for _, m := range e.Messages {
			where[string(m.Payload)] = pos{e.Ledger, e.Entry}
			total++
			if m.PartitionKey != e.Messages[0].PartitionKey {
				t.Fatalf("entry %d:%d mixes keys %q and %q", e.Ledger, e.Entry, e.Messages[0].PartitionKey, m.PartitionKey)
			}
		}
	}
	if total != n {
		t.Fatalf("broker stored %d messages, sent %d", total, n)
	}
	if len(entries)*5 > n {
		t.Fatalf("%d messages in %d entries: less than 5x fewer entries", n, len(entries))
	}
	for i, id := range ids {
		if got, want := (pos{id.LedgerID(), id.EntryID()}), where["m-"+strconv.Itoa(i)]; got != want {
			t.Fatalf("message %d: receipt says %d:%d, stored in %d:%d", i, got.l, got.e, want.l, want.e)
		}
	}
	t.Logf("%d unbatched sends stored in %d entries (%.1fx fewer)", n, len(entries), float64(n)/float64(len(entries)))
	consumeAll(t, b, topic, n, nil)
}
