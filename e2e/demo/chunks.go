package main

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/rebatchproxy/rebatchproxy/e2e/faultrelay"
)

const (
	chunkMessages = 4
	chunkSize     = 50_000 // the producer's chunk size
	chunkCount    = 3      // chunks per message
	chunkCut      = 2      // chunk sends forwarded before the relay cuts the connection
)

// chunksRun sends chunkMessages chunked messages through a fault relay in front of the broker
// (directly) or of the proxy. The relay forwards the first chunkCut chunks, lets the server store
// them but withholds their receipts, and cuts the connection: the client reconnects and resends
// them. It counts the chunks stored twice and the messages a consumer reads back whole.
func chunksRun(ctx context.Context, e env) ([]row, error) {
	var dups, whole [2]int
	for i, upstream := range []string{e.direct, e.proxy} {
		topic := e.topic("chunks", column(i))
		var err error
		dups[i], err = chunkedThroughCut(ctx, e, upstream, topic)
		if err != nil {
			return nil, err
		}
		whole[i], err = consumeWhole(ctx, e, topic)
		if err != nil {
			return nil, err
		}
	}
	return []row{
		{what: "chunks stored twice", direct: itoa(dups[0]), proxy: itoa(dups[1]), want: zero},
		{what: "messages consumed whole", direct: itoa(whole[0]), proxy: itoa(whole[1]),
			want: func(string) bool { return whole[1] == chunkMessages }},
	}, nil
}

func chunkedThroughCut(ctx context.Context, e env, upstream, topic string) (int, error) {
	u, err := url.Parse(upstream)
	if err != nil {
		return 0, err
	}
	relay, err := faultrelay.Start(faultrelay.Config{Upstream: u.Host, RewriteLookups: true,
		Rule: &faultrelay.Rule{Match: faultrelay.ChunkSends, After: chunkCut, Drain: 10 * time.Second}})
	if err != nil {
		return 0, err
	}
	defer relay.Close()
	c, err := e.client(relay.URL())
	if err != nil {
		return 0, err
	}
	defer c.Close()
	p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true, EnableChunking: true,
		ChunkMaxMessageSize: chunkSize, SendTimeout: time.Minute})
	if err != nil {
		return 0, fmt.Errorf("chunking producer on %s via %s: %w", topic, relay.URL(), err)
	}
	defer p.Close()
	err = sendAll(ctx, p, chunkMessages, func(int) *pulsar.ProducerMessage {
		return &pulsar.ProducerMessage{Payload: make([]byte, chunkSize*chunkCount-chunkSize/2)}
	}, 0)
	if err != nil {
		return 0, fmt.Errorf("%s via %s: %w", topic, upstream, err)
	}
	if len(relay.Cuts()) != 1 {
		return 0, fmt.Errorf("%s: the relay did not cut the connection (stats %+v)", topic, relay.Stats())
	}
	stored, err := e.broker.StoredEntries(ctx, topic)
	if err != nil {
		return 0, err
	}
	seen, dups := map[[2]any]bool{}, 0
	for _, s := range stored {
		k := [2]any{s.UUID, s.ChunkID}
		if seen[k] {
			dups++
		}
		seen[k] = true
	}
	return dups, nil
}

// consumeWhole reads the topic from the start, directly, and counts the messages delivered whole.
func consumeWhole(ctx context.Context, e env, topic string) (int, error) {
	c, err := e.client(e.direct)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	cons, err := c.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "demo",
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
	if err != nil {
		return 0, err
	}
	defer cons.Close()
	whole := 0
	for {
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		m, err := cons.Receive(rctx)
		cancel()
		if err != nil {
			return whole, nil // nothing more within 3 s
		}
		if len(m.Payload()) == chunkSize*chunkCount-chunkSize/2 {
			whole++
		}
		_ = cons.Ack(m)
	}
}
