package proxy_test

import (
	"bytes"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
)

// Given a proxy in front of the real broker,
// when a Go client produces 60 keyed messages through it (batching on or off,
// partitioned or not) and consumes them through it,
// then every payload comes back once, and the broker stored them as the
// producer batched them (unbatched: one entry per message).
func TestProduceConsumeThroughProxy(t *testing.T) {
	b := harness.Default(t)
	url, _ := startProxy(t, b)
	cases := []struct {
		name        string
		partitions  int
		noBatching  bool
		wantEntries func(entries, msgs int) bool
	}{
		{"non-partitioned batched", 0, false, func(e, m int) bool { return e < m }},
		{"non-partitioned unbatched", 0, true, func(e, m int) bool { return e == m }},
		{"partitioned batched", 3, false, nil},
		{"partitioned unbatched", 3, true, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			topic := uniqueTopic("pc")
			if tc.partitions > 0 {
				if err := b.CreateTopic(ctxT(t, 30*time.Second), topic, tc.partitions); err != nil {
					t.Fatal(err)
				}
			}
			c := newClient(t, url, nil)
			cons, err := c.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s", SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
			if err != nil {
				t.Fatal(err)
			}
			defer cons.Close()
			p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: tc.noBatching, BatchingMaxPublishDelay: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			const n = 60

			errs := make(chan error, n)
			for i := 0; i < n; i++ {
				p.SendAsync(ctxT(t, 20*time.Second), &pulsar.ProducerMessage{Key: fmt.Sprintf("k%d", i%7), Payload: []byte(fmt.Sprintf("m%03d", i))},
					func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) { errs <- err })
			}
			for i := 0; i < n; i++ {
				if err := <-errs; err != nil {
					t.Fatalf("send: %v", err)
				}
			}

			msgs := receiveN(t, n, cons)
			var got []string
			for _, m := range msgs {
				got = append(got, string(m.Payload()))
			}
			sort.Strings(got)
			for i, s := range got {
				if s != fmt.Sprintf("m%03d", i) {
					t.Fatalf("payload %d = %q", i, s)
				}
			}
			if tc.wantEntries != nil {
				entries, err := b.StoredEntries(ctxT(t, 30*time.Second), topic)
				if err != nil {
					t.Fatal(err)
				}
				total := 0
				for _, e := range entries {
					total += e.NumMessages
				}
				if total != n || !tc.wantEntries(len(entries), n) {
					t.Fatalf("broker stored %d entries holding %d messages", len(entries), total)
				}
			}
		})
	}
}

// Given a proxy,
// when 40 keyed messages are consumed through it under each subscription type
// (two consumers where the type allows),
// then every message is delivered exactly once, and Key_Shared keeps each key on one consumer.
func TestSubscriptionTypesThroughProxy(t *testing.T) {
	b := harness.Default(t)
	url, _ := startProxy(t, b)
	for _, st := range []pulsar.SubscriptionType{pulsar.Exclusive, pulsar.Shared, pulsar.Failover, pulsar.KeyShared} {
		t.Run(fmt.Sprint(st), func(t *testing.T) {
			topic := uniqueTopic("sub")
			c := newClient(t, url, nil)
			nCons := 2
			if st == pulsar.Exclusive {
				nCons = 1
			}
			var consumers []pulsar.Consumer
			owner := map[string]map[int]bool{}
			for i := 0; i < nCons; i++ {
				cons, err := c.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s", Type: st, Name: fmt.Sprintf("c%d", i)})
				if err != nil {
					t.Fatal(err)
				}
				defer cons.Close()
				consumers = append(consumers, cons)
			}
			p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic, BatcherBuilderType: pulsar.KeyBasedBatchBuilder})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			const n = 40

			for i := 0; i < n; i++ {
				if _, err := p.Send(ctxT(t, 20*time.Second), &pulsar.ProducerMessage{Key: fmt.Sprintf("k%d", i%5), Payload: []byte(fmt.Sprint(i))}); err != nil {
					t.Fatal(err)
				}
			}

			msgs := receiveN(t, n, consumers...)
			seen := map[string]bool{}
			for _, m := range msgs {
				if seen[string(m.Payload())] {
					t.Fatalf("message %s delivered twice", m.Payload())
				}
				seen[string(m.Payload())] = true
				if owner[m.Key()] == nil {
					owner[m.Key()] = map[int]bool{}
				}
				owner[m.Key()][m.by] = true
			}
			if st == pulsar.KeyShared {
				for k, o := range owner {
					if len(o) != 1 {
						t.Errorf("key %s went to %d consumers", k, len(o))
					}
				}
			}
		})
	}
}

// Given a proxy,
// when a producer with chunking sends a 100 KB message in 8 KB chunks through it,
// then the consumer gets the message whole and the broker stored several chunk entries.
func TestChunkedMessageThroughProxy(t *testing.T) {
	b := harness.Default(t)
	url, _ := startProxy(t, b)
	topic := uniqueTopic("chunk")
	c := newClient(t, url, nil)
	cons, err := c.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s"})
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true, EnableChunking: true, ChunkMaxMessageSize: 8 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	payload := bytes.Repeat([]byte("0123456789abcdef"), 100<<10/16)

	if _, err := p.Send(ctxT(t, 20*time.Second), &pulsar.ProducerMessage{Payload: payload}); err != nil {
		t.Fatal(err)
	}

	m := receiveN(t, 1, cons)[0]
	if !bytes.Equal(m.Payload(), payload) {
		t.Fatalf("payload of %d bytes differs", len(m.Payload()))
	}
	entries, err := b.StoredEntries(ctxT(t, 30*time.Second), topic)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) < 100/8 {
		t.Fatalf("broker stored %d entries, want >= %d chunks", len(entries), 100/8)
	}
}

type order struct {
	ID   int    `json:"id"`
	Item string `json:"item"`
}

// Given a proxy,
// when a producer and a consumer using a JSON schema talk through it,
// then the schema is registered and the value decodes on the consumer.
func TestJSONSchemaThroughProxy(t *testing.T) {
	b := harness.Default(t)
	url, _ := startProxy(t, b)
	topic := uniqueTopic("json")
	def := `{"type":"record","name":"order","fields":[{"name":"id","type":"int"},{"name":"item","type":"string"}]}`
	c := newClient(t, url, nil)
	cons, err := c.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s", Schema: pulsar.NewJSONSchema(def, nil)})
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic, Schema: pulsar.NewJSONSchema(def, nil)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	if _, err := p.Send(ctxT(t, 20*time.Second), &pulsar.ProducerMessage{Value: order{ID: 7, Item: "tea"}}); err != nil {
		t.Fatal(err)
	}

	m := receiveN(t, 1, cons)[0]
	var got order
	if err := m.GetSchemaValue(&got); err != nil || got != (order{7, "tea"}) {
		t.Fatalf("got %+v, %v", got, err)
	}
	if len(m.SchemaVersion()) == 0 {
		t.Error("message carries no schema version")
	}
}

// Given a proxy,
// when a consumer negatively acknowledges a message,
// then the broker redelivers it through the proxy with redelivery count 1.
func TestNackRedeliveryThroughProxy(t *testing.T) {
	b := harness.Default(t)
	url, _ := startProxy(t, b)
	topic := uniqueTopic("nack")
	c := newClient(t, url, nil)
	cons, err := c.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "s", Type: pulsar.Shared, NackRedeliveryDelay: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Send(ctxT(t, 20*time.Second), &pulsar.ProducerMessage{Payload: []byte("again")}); err != nil {
		t.Fatal(err)
	}
	first, err := cons.Receive(ctxT(t, 20*time.Second))
	if err != nil {
		t.Fatal(err)
	}

	cons.Nack(first)

	again, err := cons.Receive(ctxT(t, 20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if string(again.Payload()) != "again" || again.RedeliveryCount() != 1 {
		t.Fatalf("redelivered %q with count %d", again.Payload(), again.RedeliveryCount())
	}
	_ = cons.Ack(again)
}
