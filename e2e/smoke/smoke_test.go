// Package smoke checks the end-to-end harness itself, straight to a real broker with no proxy:
// what a real client produces is what the broker stores, and what the harness reads back.
package smoke

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/sirupsen/logrus"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
)

func TestMain(m *testing.M) { os.Exit(harness.Run(m, harness.Options{})) }

const (
	batchedCount   = 1000
	unbatchedCount = 50
)

func key(i int) string { return "key-" + strconv.Itoa(i%37) }

func props(i int) map[string]string {
	return map[string]string{"i": strconv.Itoa(i), "group": strconv.Itoa(i % 3)}
}

func payload(i int) string { return fmt.Sprintf("payload-%06d", i) }

func quietLogger() log.Logger { return harness.ClientLogger(logrus.WarnLevel) }

// entryKey names a stored entry by ledger:entry.
type entryKey struct{ ledger, entry int64 }

// Given a real broker and the latest pulsar-client-go,
// when a batching producer sends 1,000 keyed messages with properties and a non-batching
// producer then sends 50,
// then a consumer receives all 1,050 in order with their keys, properties and payloads, and the
// entries the broker stored are exactly the batches the client reported, message for message.
func TestLatestGoClientRoundTripMatchesStoredEntries(t *testing.T) {
	b := harness.Default(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	topic := fmt.Sprintf("persistent://public/default/smoke-%d", time.Now().UnixNano())

	client, err := pulsar.NewClient(pulsar.ClientOptions{URL: b.ServiceURL, Logger: quietLogger()})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	defer client.Close()
	consumer, err := client.Subscribe(pulsar.ConsumerOptions{
		Topic: topic, SubscriptionName: "smoke", Type: pulsar.Exclusive,
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest,
	})
	if err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	defer consumer.Close()

	// Which entry holds each message, as the client was told in its receipts.
	perEntry := map[entryKey][]int{}
	var entryOrder []entryKey
	record := func(i int, id pulsar.MessageID) {
		k := entryKey{id.LedgerID(), id.EntryID()}
		if _, ok := perEntry[k]; !ok {
			entryOrder = append(entryOrder, k)
		}
		perEntry[k] = append(perEntry[k], i)
	}

	batched, err := client.CreateProducer(pulsar.ProducerOptions{
		Topic: topic, BatchingMaxMessages: 100, BatchingMaxPublishDelay: 20 * time.Millisecond,
	})
	if err != nil {
		t.Fatalf("batched producer: %v", err)
	}
	ids := make([]pulsar.MessageID, batchedCount)
	errs := make(chan error, batchedCount)
	for i := 0; i < batchedCount; i++ {
		i := i
		batched.SendAsync(ctx, &pulsar.ProducerMessage{Payload: []byte(payload(i)), Key: key(i), Properties: props(i)},
			func(id pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
				ids[i] = id
				errs <- err
			})
	}
	for i := 0; i < batchedCount; i++ {
		if err := <-errs; err != nil {
			t.Fatalf("batched send: %v", err)
		}
	}
	batched.Close()
	for i, id := range ids {
		record(i, id)
	}

	single, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true})
	if err != nil {
		t.Fatalf("unbatched producer: %v", err)
	}
	for i := batchedCount; i < batchedCount+unbatchedCount; i++ {
		id, err := single.Send(ctx, &pulsar.ProducerMessage{Payload: []byte(payload(i)), Key: key(i), Properties: props(i)})
		if err != nil {
			t.Fatalf("unbatched send %d: %v", i, err)
		}
		record(i, id)
	}
	single.Close()

	// Consume everything back, in order.
	for want := 0; want < batchedCount+unbatchedCount; want++ {
		msg, err := consumer.Receive(ctx)
		if err != nil {
			t.Fatalf("receive message %d: %v", want, err)
		}
		if got := string(msg.Payload()); got != payload(want) {
			t.Fatalf("message %d: payload %q, want %q", want, got, payload(want))
		}
		if msg.Key() != key(want) {
			t.Fatalf("message %d: key %q, want %q", want, msg.Key(), key(want))
		}
		assertProps(t, fmt.Sprintf("message %d", want), msg.Properties(), props(want))
		if err := consumer.Ack(msg); err != nil {
			t.Fatalf("ack %d: %v", want, err)
		}
	}

	// What the broker stored.
	entries, err := b.StoredEntries(ctx, topic)
	if err != nil {
		t.Fatalf("reading stored entries: %v", err)
	}
	if len(entries) != len(entryOrder) {
		t.Fatalf("broker stored %d entries, client was told of %d", len(entries), len(entryOrder))
	}
	batchedEntries := 0
	for n, e := range entries {
		k := entryKey{e.Ledger, e.Entry}
		if k != entryOrder[n] {
			t.Fatalf("stored entry %d is %d:%d, client order says %d:%d", n, e.Ledger, e.Entry, entryOrder[n].ledger, entryOrder[n].entry)
		}
		members := perEntry[k]
		wantBatched := members[0] < batchedCount
		if e.Batched != wantBatched {
			t.Fatalf("entry %d:%d batched=%v, want %v", e.Ledger, e.Entry, e.Batched, wantBatched)
		}
		if e.NumMessages != len(members) || len(e.Messages) != len(members) {
			t.Fatalf("entry %d:%d holds %d messages (%d parsed), client put %d there", e.Ledger, e.Entry, e.NumMessages, len(e.Messages), len(members))
		}
		if e.Batched {
			batchedEntries++
		}
		for j, i := range members {
			m := e.Messages[j]
			if string(m.Payload) != payload(i) || m.PartitionKey != key(i) {
				t.Fatalf("entry %d:%d record %d: payload %q key %q, want %q %q", e.Ledger, e.Entry, j, m.Payload, m.PartitionKey, payload(i), key(i))
			}
			assertProps(t, fmt.Sprintf("entry %d:%d record %d", e.Ledger, e.Entry, j), m.Properties, props(i))
		}
	}
	if batchedEntries == 0 || batchedEntries >= batchedCount {
		t.Fatalf("%d batched entries for %d batched messages: the client did not batch", batchedEntries, batchedCount)
	}
	if got := len(entries) - batchedEntries; got != unbatchedCount {
		t.Fatalf("%d unbatched entries, want %d", got, unbatchedCount)
	}
	t.Logf("broker %s stored %d entries: %d batches for %d messages, %d single messages", b.Version, len(entries), batchedEntries, batchedCount, unbatchedCount)
}

func assertProps(t *testing.T, where string, got, want map[string]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: properties %v, want %v", where, got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("%s: properties %v, want %v", where, got, want)
		}
	}
}
