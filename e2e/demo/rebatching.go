package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
)

const (
	coalesceMessages   = 2000
	propertiesMessages = 2000
)

var regions = []string{"us", "eu", "ap"}

const regionRun = 25

// coalesceRun sends coalesceMessages unbatched, asynchronously, and counts the entries stored.
func coalesceRun(ctx context.Context, e env) ([]row, error) {
	var entries [2]int
	for i, url := range []string{e.direct, e.proxy} {
		topic := e.topic("coalesce", column(i))
		stored, err := produce(ctx, e, url, topic, pulsar.ProducerOptions{DisableBatching: true}, coalesceMessages,
			func(int) *pulsar.ProducerMessage { return &pulsar.ProducerMessage{Payload: make([]byte, 100)} })
		if err != nil {
			return nil, err
		}
		entries[i] = len(stored)
	}
	return []row{
		{what: "entries stored", direct: itoa(entries[0]), proxy: itoa(entries[1])},
		{what: "messages per entry", direct: ratio(coalesceMessages, entries[0]), proxy: ratio(coalesceMessages, entries[1]),
			want: func(s string) bool { return entries[1] > 0 && entries[1] < coalesceMessages/2 }},
	}, nil
}

// propertiesRun sends propertiesMessages with the client's default batching, each with a region
// property that changes every regionRun messages, and counts the stored entries that mix regions
// and those stamped with their region. (The policy keeps each producer's order, so it merges runs
// of one region: a region changing at every message would give entries of one message.)
func propertiesRun(ctx context.Context, e env) ([]row, error) {
	var entries, mixed, stamped [2]int
	for i, url := range []string{e.direct, e.proxy} {
		topic := e.topic("properties", column(i))
		stored, err := produce(ctx, e, url, topic, pulsar.ProducerOptions{}, propertiesMessages, func(n int) *pulsar.ProducerMessage {
			return &pulsar.ProducerMessage{Payload: make([]byte, 100), Properties: map[string]string{"region": regions[n/regionRun%len(regions)]}}
		})
		if err != nil {
			return nil, err
		}
		entries[i] = len(stored)
		for _, s := range stored {
			seen := map[string]bool{}
			for _, m := range s.Messages {
				seen[m.Properties["region"]] = true
			}
			if len(seen) > 1 {
				mixed[i]++
			}
			if r, ok := s.Properties["region"]; ok && len(seen) == 1 && seen[r] {
				stamped[i]++
			}
		}
	}
	return []row{
		{what: "entries stored", direct: itoa(entries[0]), proxy: itoa(entries[1])},
		{what: "messages per entry", direct: ratio(propertiesMessages, entries[0]), proxy: ratio(propertiesMessages, entries[1])},
		{what: "entries mixing regions", direct: itoa(mixed[0]), proxy: itoa(mixed[1]), want: zero},
		{what: "entries with their region as outer property", direct: itoa(stamped[0]), proxy: itoa(stamped[1]),
			want: func(string) bool { return stamped[1] == entries[1] }},
	}, nil
}

func column(i int) string { return [2]string{"direct", "proxy"}[i] }

// produce sends n messages made by msg through url with opts, asynchronously, waits for every
// receipt and returns what the broker stored.
func produce(ctx context.Context, e env, url, topic string, opts pulsar.ProducerOptions, n int, msg func(int) *pulsar.ProducerMessage) ([]harness.StoredEntry, error) {
	c, err := e.client(url)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	opts.Topic = topic
	p, err := c.CreateProducer(opts)
	if err != nil {
		return nil, fmt.Errorf("producer on %s via %s: %w", topic, url, err)
	}
	defer p.Close()
	if err := sendAll(ctx, p, n, msg, 0); err != nil {
		return nil, fmt.Errorf("%s via %s: %w", topic, url, err)
	}
	return e.broker.StoredEntries(ctx, topic)
}

// sendAll sends n messages asynchronously, pausing for pause after each hundred (so that a
// batching client closes several batches), and waits for every receipt.
func sendAll(ctx context.Context, p pulsar.Producer, n int, msg func(int) *pulsar.ProducerMessage, pause time.Duration) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	wg.Add(n)
	for i := 0; i < n; i++ {
		p.SendAsync(ctx, msg(i), func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
			if err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
			wg.Done()
		})
		if pause > 0 && i%100 == 99 {
			time.Sleep(pause)
		}
	}
	wg.Wait()
	return first
}
