// Package rebatch_test drives real clients through the proxy under the rewriting policies
// (coalesce, properties, buckets) against a real Apache Pulsar broker, and checks what the broker
// stored entry by entry. See README.md.
package rebatch_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	plog "github.com/apache/pulsar-client-go/pulsar/log"
	"github.com/sirupsen/logrus"

	"github.com/rebatchproxy/rebatchproxy/chunkdedup"
	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/proxy"
	"github.com/rebatchproxy/rebatchproxy/rebatch"
	"github.com/rebatchproxy/rebatchproxy/route"
)

func TestMain(m *testing.M) { os.Exit(harness.Run(m, harness.Options{})) }

// startProxy runs the proxy in-process with one policy for every topic of namespace ns, and
// returns its service URL.
func startProxy(t *testing.T, b *harness.Broker, ns string, pol rebatch.Policy) string {
	t.Helper()
	px, _ := startProxyServer(t, b, ns, pol)
	return px.URL
}

// startProxyServer is startProxy returning the running proxy and its producer-path metrics.
func startProxyServer(t *testing.T, b *harness.Broker, ns string, pol rebatch.Policy) (*harness.InProcessProxy, *proxy.RebatchMetrics) {
	t.Helper()
	if err := pol.Validate(); err != nil { // as cmd/proxy validates every rule
		t.Fatal(err)
	}
	m, err := route.NewMatcher([]route.Rule[rebatch.Policy]{{Pattern: ns + "/*", Policy: pol}})
	if err != nil {
		t.Fatal(err)
	}
	metrics := proxy.NewRebatchMetrics()
	px, err := harness.StartProxy(b.ServiceURL, func(c *proxy.Config) {
		if testing.Verbose() {
			c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
		}
		pols := proxy.NewPolicies(m)
		c.ProducerPaths = proxy.RebatchPaths(pols, metrics, proxy.NewChunkDedup(chunkdedup.Config{}), c.Logger)
		c.ManagedKeyShared = pols.ManagedKeyShared // as cmd/proxy wires it
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Stop)
	return px, metrics
}

func quietLogger() plog.Logger { return harness.ClientLogger(logrus.ErrorLevel) }

func newClient(t *testing.T, url string) pulsar.Client {
	t.Helper()
	c, err := pulsar.NewClient(pulsar.ClientOptions{URL: url, Logger: quietLogger(), OperationTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// newNamespace creates a fresh namespace so each test's policy rule is its own.
func newNamespace(t *testing.T, b *harness.Broker, name string) string {
	t.Helper()
	ns := fmt.Sprintf("public/%s-%d", name, time.Now().UnixNano())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	return ns
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
