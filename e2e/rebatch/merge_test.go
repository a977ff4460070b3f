package rebatch_test

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/rebatch"
)

// Given the proxy with coalesce, merge_producers and hold_when_idle (batches wait max_delay
// even when the lane is idle: the setting for the fewest entries),
// when 100 producers of one client each send 20 messages synchronously (one message, then
// wait for its receipt),
// then the broker stores at least 20 times fewer entries than messages, every send returns
// its receipt, and a consumer receives each message once, in each producer's order.
func TestCoalesceMergeProducersForSynchronousSenders(t *testing.T) {
	b := harness.Default(t)
	ns := newNamespace(t, b, "merge")
	url := startProxy(t, b, ns, rebatch.Policy{Kind: rebatch.Coalesce, MergeProducers: true, HoldWhenIdle: true, MaxDelay: 50 * time.Millisecond})
	topic := "persistent://" + ns + "/t"
	const producers, perProducer = 100, 20
	c := newClient(t, url)
	ctx := ctxT(t, 3*time.Minute)
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for p := 0; p < producers; p++ {
		prod, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true, Name: fmt.Sprintf("sync-%03d", p)})
		if err != nil {
			t.Fatalf("producer %d: %v", p, err)
		}
		wg.Add(1)
		go func(p int, prod pulsar.Producer) {
			defer wg.Done()
			defer prod.Close()
			for i := 0; i < perProducer; i++ {
				if _, err := prod.Send(ctx, &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("p%03d-%d", p, i))}); err != nil {
					errs <- fmt.Errorf("producer %d message %d: %w", p, i, err)
					return
				}
			}
		}(p, prod)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	entries, err := b.StoredEntries(ctxT(t, time.Minute), topic)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, e := range entries {
		total += len(e.Messages)
	}
	const n = producers * perProducer
	if total != n {
		t.Fatalf("broker stored %d messages, sent %d", total, n)
	}
	if len(entries)*20 > n {
		t.Fatalf("%d messages in %d entries: less than 20x fewer", n, len(entries))
	}
	t.Logf("%d synchronous sends from %d producers stored in %d entries (%.1fx fewer)", n, producers, len(entries), float64(n)/float64(len(entries)))

	direct := newClient(t, b.ServiceURL)
	cons, err := direct.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "check",
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	next := map[string]int{}
	for i := 0; i < n; i++ {
		m, err := cons.Receive(ctx)
		if err != nil {
			t.Fatalf("receive %d: %v", i, err)
		}
		prod, idx, _ := strings.Cut(string(m.Payload()), "-")
		k, _ := strconv.Atoi(idx)
		if k != next[prod] {
			t.Fatalf("%s: message %d after %d (order or exactly-once broken)", prod, k, next[prod]-1)
		}
		next[prod]++
		_ = cons.Ack(m)
	}
}
