// Package proxy_test drives real pulsar-client-go v0.21.0 clients through the
// proxy (started in-process) against a real Apache Pulsar broker, and
// checks what the broker stored. See README.md.
package proxy_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	plog "github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/sirupsen/logrus"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/proxy"
)

func TestMain(m *testing.M) { os.Exit(harness.Run(m, harness.Options{})) }

// startProxy runs a proxy in front of b and returns its pulsar:// URL and its log.
func startProxy(t *testing.T, b *harness.Broker) (string, *harness.LogBuffer) {
	t.Helper()
	logs := &harness.LogBuffer{}
	px, err := harness.StartProxy(b.ServiceURL, func(c *proxy.Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Stop)
	return px.URL, logs
}

func quietLogger() plog.Logger { return harness.ClientLogger(logrus.WarnLevel) }

func newClient(t *testing.T, url string, auth pulsar.Authentication) pulsar.Client {
	t.Helper()
	c, err := pulsar.NewClient(pulsar.ClientOptions{URL: url, OperationTimeout: 15 * time.Second,
		ConnectionTimeout: 5 * time.Second, Logger: quietLogger(), Authentication: auth})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func uniqueTopic(name string) string {
	return fmt.Sprintf("persistent://public/default/proxy-%s-%d", name, time.Now().UnixNano())
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// received is a message and the index of the consumer that got it.
type received struct {
	pulsar.Message
	by int
}

// receiveN receives n messages from any of the consumers, acking each.
func receiveN(t *testing.T, n int, consumers ...pulsar.Consumer) []received {
	t.Helper()
	ch := make(chan received, n)
	ctx := ctxT(t, 30*time.Second)
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := 0
	for i, c := range consumers {
		wg.Add(1)
		go func(i int, c pulsar.Consumer) {
			defer wg.Done()
			for {
				mu.Lock()
				if got >= n {
					mu.Unlock()
					return
				}
				mu.Unlock()
				rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				m, err := c.Receive(rctx)
				cancel()
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					continue
				}
				_ = c.Ack(m)
				mu.Lock()
				got++
				mu.Unlock()
				ch <- received{m, i}
			}
		}(i, c)
	}
	wg.Wait()
	close(ch)
	var out []received
	for m := range ch {
		out = append(out, m)
	}
	if len(out) != n {
		t.Fatalf("received %d messages, want %d", len(out), n)
	}
	return out
}
