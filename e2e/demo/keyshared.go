package main

import (
	"context"
	"fmt"
	"math/rand"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
)

const (
	bucketsMessages = 2000
	bucketsKeys     = 200
)

// bucketsRun subscribes two Key_Shared consumers with default settings (AUTO_SPLIT) and sends
// bucketsMessages over bucketsKeys random keys with the client's default batching, in rounds, so
// that it stores many batches. Directly, a batch goes to the owner of its one outer key with all
// its keys; through the proxy (buckets, managed Key_Shared), every key reaches one consumer.
func bucketsRun(ctx context.Context, e env) ([]row, error) {
	var split, wrong, entries [2]int
	for i, url := range []string{e.direct, e.proxy} {
		topic := e.topic("buckets", column(i))
		var err error
		split[i], wrong[i], err = keySharedRun(ctx, e, url, topic)
		if err != nil {
			return nil, err
		}
		stored, err := e.broker.StoredEntries(ctx, topic)
		if err != nil {
			return nil, err
		}
		entries[i] = len(stored)
	}
	return []row{
		{what: "entries stored (one batch per bucket through the proxy)", direct: itoa(entries[0]), proxy: itoa(entries[1])},
		{what: "keys delivered to both consumers", direct: itoa(split[0]), proxy: itoa(split[1]), want: zero},
		{what: "messages at a consumer other than the key's", direct: itoa(wrong[0]), proxy: itoa(wrong[1]), want: zero},
	}, nil
}

// keySharedRun runs the buckets workload with producer and consumers at url and returns the keys
// seen at both consumers and the messages that reached the consumer with fewer of their key.
func keySharedRun(ctx context.Context, e env, url, topic string) (split, wrong int, err error) {
	c, err := e.client(url)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	type got struct {
		consumer int
		key      string
	}
	ch := make(chan got, bucketsMessages)
	for i := 0; i < 2; i++ {
		cons, err := c.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "demo", Type: pulsar.KeyShared,
			SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
		if err != nil {
			return 0, 0, fmt.Errorf("Key_Shared consumer %d on %s via %s: %w", i, topic, url, err)
		}
		defer cons.Close()
		go func(i int) {
			for m := range cons.Chan() {
				_ = cons.Ack(m)
				ch <- got{i, m.Key()}
			}
		}(i)
	}
	p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic})
	if err != nil {
		return 0, 0, fmt.Errorf("producer on %s via %s: %w", topic, url, err)
	}
	defer p.Close()
	rnd := rand.New(rand.NewSource(1))
	keys := make([]string, bucketsMessages)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%d", rnd.Intn(bucketsKeys))
	}
	err = sendAll(ctx, p, bucketsMessages, func(i int) *pulsar.ProducerMessage {
		return &pulsar.ProducerMessage{Payload: make([]byte, 100), Key: keys[i]}
	}, 15*time.Millisecond)
	if err != nil {
		return 0, 0, fmt.Errorf("%s via %s: %w", topic, url, err)
	}
	counts := map[string]*[2]int{}
	deadline := time.After(time.Minute)
	for n := 0; n < bucketsMessages; n++ {
		select {
		case g := <-ch:
			if counts[g.key] == nil {
				counts[g.key] = new([2]int)
			}
			counts[g.key][g.consumer]++
		case <-deadline:
			return 0, 0, fmt.Errorf("%s via %s: consumers received %d of %d messages in a minute", topic, url, n, bucketsMessages)
		}
	}
	for _, c := range counts {
		if c[0] > 0 && c[1] > 0 {
			split++
			wrong += min(c[0], c[1])
		}
	}
	return split, wrong, nil
}
