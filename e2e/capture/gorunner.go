package main

import (
	"context"
	"fmt"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	plog "github.com/apache/pulsar-client-go/pulsar/log"
)

// goClientVersion reports the pulsar-client-go version this binary links.
func goClientVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/apache/pulsar-client-go" {
				return d.Version
			}
		}
	}
	return "unknown"
}

// payloadFor returns message i's payload, "msg-<i>" padded with dots to
// the scenario's size: the convention of the e2e drivers (e2e/drivers), so
// every capture can be checked the same way.
func payloadFor(i, size int) []byte {
	s := "msg-" + strconv.Itoa(i)
	if len(s) < size {
		s += strings.Repeat(".", size-len(s))
	}
	return []byte(s)
}

// runGo drives one scenario with the pulsar-client-go linked into this
// binary: subscribe, produce, receive everything, acknowledge, close.
func runGo(ctx context.Context, url, topic string, s Scenario) error {
	client, err := pulsar.NewClient(pulsar.ClientOptions{
		URL:               url,
		OperationTimeout:  30 * time.Second,
		ConnectionTimeout: 10 * time.Second,
		Logger:            plog.DefaultNopLogger(),
	})
	if err != nil {
		return err
	}
	defer client.Close()

	consumer, err := client.Subscribe(pulsar.ConsumerOptions{
		Topic:                       topic,
		SubscriptionName:            "golden",
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest,
	})
	if err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	defer consumer.Close()

	opts := pulsar.ProducerOptions{
		Topic:                   topic,
		Name:                    "golden-" + s.Name,
		DisableBatching:         !s.Batching,
		BatchingMaxMessages:     uint(s.Count),
		BatchingMaxPublishDelay: 10 * time.Second, // flushed explicitly below
		EnableChunking:          s.Chunking,
		ChunkMaxMessageSize:     uint(s.ChunkSize),
		SendTimeout:             30 * time.Second,
	}
	if s.KeyBased {
		opts.BatcherBuilderType = pulsar.KeyBasedBatchBuilder
	}
	switch s.Compression {
	case "none":
	case "lz4":
		opts.CompressionType = pulsar.LZ4
	case "zlib":
		opts.CompressionType = pulsar.ZLib
	case "zstd":
		opts.CompressionType = pulsar.ZSTD
	case "snappy":
		opts.CompressionType = pulsar.SNAPPY
	default:
		return fmt.Errorf("unknown compression %q", s.Compression)
	}
	producer, err := client.CreateProducer(opts)
	if err != nil {
		return fmt.Errorf("create producer: %w", err)
	}
	defer producer.Close()

	errs := make(chan error, s.Count)
	for i := 0; i < s.Count; i++ {
		m := &pulsar.ProducerMessage{Payload: payloadFor(i, s.Size), EventTime: time.UnixMilli(1700000000000 + int64(i))}
		if s.Keys {
			m.Key = "key-" + strconv.Itoa(i%8)
			if s.OrderingKey {
				m.OrderingKey = m.Key
			}
		}
		if s.Properties {
			m.Properties = map[string]string{"index": strconv.Itoa(i), "region": strconv.Itoa(i % 2)}
		}
		if s.Batching {
			producer.SendAsync(ctx, m, func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) { errs <- err })
		} else {
			_, err := producer.Send(ctx, m)
			errs <- err
		}
	}
	if err := producer.FlushWithCtx(ctx); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	for i := 0; i < s.Count; i++ {
		if err := <-errs; err != nil {
			return fmt.Errorf("send %d: %w", i, err)
		}
	}
	for i := 0; i < s.Count; i++ {
		msg, err := consumer.Receive(ctx)
		if err != nil {
			return fmt.Errorf("receive %d: %w", i, err)
		}
		if err := consumer.Ack(msg); err != nil {
			return fmt.Errorf("ack: %w", err)
		}
	}
	return nil
}
