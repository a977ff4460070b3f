package main

import (
	"context"
	"fmt"

	"github.com/rebatchproxy/rebatchproxy/e2e/drivers"
)

// runE2EDriver drives one scenario with a pinned client from e2e/drivers
// (older pulsar-client-go releases, the Java and Python clients): start a
// consumer, produce, wait until every message is acknowledged. The
// scenarios map onto the drivers' shared command line, whose payload, key
// and property conventions the built-in drivers follow too.
func runE2EDriver(ctx context.Context, d *drivers.Driver, url, topic string, s Scenario) error {
	if s.Chunking && !d.Supports(drivers.FeatureChunking) ||
		s.Compression == "snappy" && !d.Supports(drivers.FeatureSnappy) ||
		s.OrderingKey && !d.Supports(drivers.FeatureOrderingKey) {
		return errUnsupported
	}
	spec := drivers.ProduceSpec{
		URL: url, Topic: topic, Count: s.Count,
		Batching:    drivers.Bool(s.Batching),
		Compression: s.Compression,
		Chunking:    s.Chunking,
		Size:        s.Size,
		OrderingKey: s.OrderingKey,
	}
	if s.Batching {
		spec.BatchMaxMessages = s.Count
		spec.BatchDelay = drivers.Int(10_000) // the count closes the batch
	}
	if s.KeyBased {
		spec.Batcher = "key-based"
	}
	if s.Keys {
		spec.KeyMode, spec.Keys = "seq", 8
	}
	if s.Properties {
		spec.Properties = "index={i},region={i%2}"
	}
	if s.Chunking && d.Supports(drivers.FeatureChunkSize) {
		spec.ChunkSize = s.ChunkSize
	} // otherwise the relay's lowered max_message_size makes the client chunk

	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	consume, err := d.StartConsume(cctx, drivers.ConsumeSpec{
		URL: url, Topic: topic, Subscription: "golden", Count: s.Count, InitialPosition: "earliest",
	})
	if drivers.IsUnsupported(err) {
		return errUnsupported
	}
	if err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	if _, err := d.Produce(ctx, spec); err != nil {
		if drivers.IsUnsupported(err) {
			return errUnsupported
		}
		return fmt.Errorf("produce: %w", err)
	}
	if _, err := consume.Wait(); err != nil {
		return fmt.Errorf("consume: %w", err)
	}
	return nil
}
