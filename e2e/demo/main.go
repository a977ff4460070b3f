// Command demo sends traffic through the proxy and shows that it arrived: it produces keyed
// messages with properties (batched and unbatched) through the proxy's service URL, consumes
// them back through the proxy, and reads what the broker stored through its admin API.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/sirupsen/logrus"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
)

func main() {
	proxyURL := flag.String("proxy", "pulsar://127.0.0.1:6650", "the proxy's service URL")
	adminURL := flag.String("admin", "http://127.0.0.1:18080", "the broker's admin URL, to read what it stored")
	count := flag.Int("n", 200, "messages to send")
	flag.Parse()
	if err := run(*proxyURL, *adminURL, *count); err != nil {
		fmt.Fprintln(os.Stderr, "demo: FAILED:", err)
		os.Exit(1)
	}
}

func run(proxyURL, adminURL string, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l := logrus.New()
	l.SetLevel(logrus.WarnLevel)
	client, err := pulsar.NewClient(pulsar.ClientOptions{URL: proxyURL, Logger: log.NewLoggerWithLogrus(l), OperationTimeout: 20 * time.Second})
	if err != nil {
		return err
	}
	defer client.Close()
	topic := fmt.Sprintf("persistent://public/default/demo-%d", time.Now().Unix())
	consumer, err := client.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "demo", SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
	if err != nil {
		return fmt.Errorf("subscribe through the proxy: %w", err)
	}
	defer consumer.Close()
	producer, err := client.CreateProducer(pulsar.ProducerOptions{Topic: topic})
	if err != nil {
		return fmt.Errorf("create producer through the proxy: %w", err)
	}
	start := time.Now()
	for i := 0; i < n; i++ {
		msg := &pulsar.ProducerMessage{Payload: []byte(fmt.Sprintf("hello %d", i)), Key: fmt.Sprintf("key-%d", i%10), Properties: map[string]string{"i": fmt.Sprint(i)}}
		if i%2 == 0 {
			producer.SendAsync(ctx, msg, func(pulsar.MessageID, *pulsar.ProducerMessage, error) {})
			continue
		}
		if _, err := producer.Send(ctx, msg); err != nil {
			return fmt.Errorf("send %d: %w", i, err)
		}
	}
	if err := producer.FlushWithCtx(ctx); err != nil {
		return err
	}
	fmt.Printf("demo: produced %d messages through %s to %s in %v\n", n, proxyURL, topic, time.Since(start).Round(time.Millisecond))
	for i := 0; i < n; i++ {
		m, err := consumer.Receive(ctx)
		if err != nil {
			return fmt.Errorf("receive %d: %w", i, err)
		}
		if got, want := string(m.Payload()), fmt.Sprintf("hello %d", i); got != want {
			return fmt.Errorf("message %d is %q, want %q", i, got, want)
		}
		_ = consumer.Ack(m)
	}
	fmt.Printf("demo: consumed all %d back through the proxy, in order\n", n)
	b := harness.Attach("", adminURL, "")
	entries, err := b.StoredEntries(ctx, topic)
	if err != nil {
		return fmt.Errorf("reading stored entries: %w", err)
	}
	msgs := 0
	for _, e := range entries {
		msgs += e.NumMessages
	}
	fmt.Printf("demo: the broker stored %d messages in %d entries\n", msgs, len(entries))
	if msgs != n {
		return fmt.Errorf("broker stored %d messages, want %d", msgs, n)
	}
	return nil
}
