package rebatch_test

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/rebatch"
	"github.com/rebatchproxy/rebatchproxy/route"
	"github.com/rebatchproxy/rebatchproxy/wire/batch"
	"github.com/rebatchproxy/rebatchproxy/wire/compression"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// keySharedRun is what four Key_Shared STICKY consumers, each owning one of four equal
// buckets of the hashB ring, received from one topic.
type keySharedRun struct {
	received   int
	violations int // messages delivered to a consumer whose range does not hold their key's hash
	outOfOrder int // messages of a key received after a later message of that key
}

// runKeyShared subscribes the four consumers through url (the broker, or the proxy, which
// leaves ranges the application chose alone), produces msgs through url with default
// batching, and counts what each consumer got.
func runKeyShared(t *testing.T, b *harness.Broker, url, topic string, keys []string) keySharedRun {
	t.Helper()
	ring, err := route.NewEqualBuckets(4)
	if err != nil {
		t.Fatal(err)
	}
	var opts []pulsar.ConsumerOptions
	for i := 0; i < ring.Len(); i++ {
		lo, hi := ring.Range(i)
		policy, err := pulsar.NewKeySharedPolicySticky([]int{int(lo), int(hi)})
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, pulsar.ConsumerOptions{Name: fmt.Sprintf("bucket-%d", i), KeySharedPolicy: policy})
	}
	ch, stop := keySharedConsumers(t, url, topic, opts, len(keys)) // aligned: the proxy leaves their ranges alone
	produceKeyed(t, url, topic, keys, true)

	var run keySharedRun
	last := map[string]int{}
	deadline := time.After(2 * time.Minute)
	for run.received < len(keys) {
		select {
		case g := <-ch:
			run.received++
			if g.key == "" {
				continue // keyless: spread over the buckets, owned by no consumer
			}
			// The key as the broker hashes it: a partition key read as a Java String.
			if ring.Bucket(route.HashB(route.StickyKey(route.KeyFields{PartitionKey: g.key, HasPartitionKey: true}))) != g.consumer {
				run.violations++
			}
			if prev, ok := last[g.key]; ok && g.idx < prev {
				run.outOfOrder++
			}
			last[g.key] = g.idx
		case <-deadline:
			t.Fatalf("received %d of %d messages", run.received, len(keys))
		}
	}
	stop()
	return run
}

// Given four Key_Shared STICKY consumers whose hash ranges are aligned to four equal buckets
// (the application's own ranges: through the proxy they are not managed),
// when a producer with default batching sends 10,000 messages with random keys (a fifth of
// them invalid UTF-8, one message in twenty keyless), once
// directly to the broker and once through the proxy's buckets policy,
// then through the proxy every message reaches the consumer that owns its key's hash, in
// per-key order, while the direct run delivers messages to consumers that do not own them.
func TestBucketsPolicyKeepsKeySharedStickyAffinity(t *testing.T) {
	b := harness.Default(t)
	ns := newNamespace(t, b, "buckets")
	url := startProxy(t, b, ns, rebatch.Policy{Kind: rebatch.Buckets, Buckets: 4, MaxDelay: 5 * time.Millisecond})
	rnd := rand.New(rand.NewSource(7))
	pool := make([]string, 2000)
	for i := range pool {
		pool[i] = fmt.Sprintf("key-%08x", rnd.Uint32())
	}
	for i := 0; i < len(pool); i += 5 {
		pool[i] = fmt.Sprintf("\xff%c\xe2\x82-%d", 0x80+i%64, i) // invalid UTF-8
	}
	keys := make([]string, 10000)
	for i := range keys {
		if rnd.Intn(20) > 0 { // one in twenty keyless
			keys[i] = pool[rnd.Intn(len(pool))]
		}
	}

	directRun := runKeyShared(t, b, b.ServiceURL, "persistent://"+ns+"/direct", keys)
	proxied := runKeyShared(t, b, url, "persistent://"+ns+"/proxied", keys)
	t.Logf("direct:        %d messages, %d delivered to a consumer that does not own the key, %d out of key order",
		directRun.received, directRun.violations, directRun.outOfOrder)
	t.Logf("through proxy: %d messages, %d delivered to a consumer that does not own the key, %d out of key order",
		proxied.received, proxied.violations, proxied.outOfOrder)
	if proxied.violations != 0 || proxied.outOfOrder != 0 {
		t.Fatalf("through the proxy: %d affinity violations, %d out of order; want 0 and 0", proxied.violations, proxied.outOfOrder)
	}
	if directRun.violations == 0 {
		t.Fatalf("the direct run shows no violation: the workload does not exercise mixed-key batches")
	}
	checkEntryHashRanges(t, b, "persistent://"+ns+"/proxied", len(keys))
}

// checkEntryHashRanges reads the topic's entries over the binary protocol (the REST API does
// not show fields 33/34) and checks each carries exactly the hashB range of its messages, and
// that the range lies in one bucket.
func checkEntryHashRanges(t *testing.T, b *harness.Broker, topic string, n int) {
	t.Helper()
	ring, _ := route.NewEqualBuckets(4)
	entries, err := b.ReadRawEntries(ctxT(t, time.Minute), topic, n)
	if err != nil {
		t.Fatalf("reading raw entries: %v", err)
	}
	total := 0
	for _, e := range entries {
		md := e.Metadata
		if md.EntryHashMin == nil || md.EntryHashMax == nil {
			t.Fatalf("entry %d:%d has no entry_hash_min/max", e.Ledger, e.Entry)
		}
		payload := e.Payload
		if md.GetCompression() != pulsarpb.CompressionType_NONE {
			if payload, err = compression.Decompress(nil, md.GetCompression(), payload, int(md.GetUncompressedSize()), 0); err != nil {
				t.Fatal(err)
			}
		}
		lo, hi := uint32(65535), uint32(0)
		// The lane producer is named <client producer>-bucket-<i>; a keyless message is
		// bucketed by the broker's fallback key "<client producer>-<sequence id>".
		client := md.GetProducerName()[:strings.LastIndex(md.GetProducerName(), "-bucket-")]
		it := batch.NewIterator(payload, int(md.GetNumMessagesInBatch()))
		for it.Next() {
			m := it.Meta()
			h := uint32(route.HashB(route.StickyKey(route.KeyFields{PartitionKey: string(m.PartitionKey), HasPartitionKey: m.HasPartitionKey,
				ProducerName: client, HasProducerName: true, SequenceID: m.SequenceID, HasSequenceID: m.HasSequenceID})))
			lo, hi = min(lo, h), max(hi, h)
			total++
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		if md.GetEntryHashMin() != lo || md.GetEntryHashMax() != hi {
			t.Fatalf("entry %d:%d stamped %d..%d, its messages hash to %d..%d", e.Ledger, e.Entry, md.GetEntryHashMin(), md.GetEntryHashMax(), lo, hi)
		}
		if ring.Bucket(uint16(lo)) != ring.Bucket(uint16(hi)) {
			t.Fatalf("entry %d:%d spans buckets: %d..%d", e.Ledger, e.Entry, lo, hi)
		}
	}
	if total != n {
		t.Fatalf("raw entries hold %d messages, want %d", total, n)
	}
	t.Logf("%d entries, each stamped with its messages' exact hashB range inside one bucket", len(entries))
}
