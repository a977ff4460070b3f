// Package chunks_test reproduces the duplicate-chunk failure of PIP-295 against a real broker:
// real chunking producers (pulsar-client-go, Java 2.10.6, through e2e/drivers) lose their
// connection, through e2e/faultrelay, after some chunks reached the broker but before their
// receipts reached the client; they reconnect and resend; the topic then holds duplicate chunks
// (read raw) and a pulsar-client-go v0.18.0 consumer fails to deliver the affected messages.
//
// The direct reproduction (no proxy) asserts that the failure happens; the same scenario through
// the proxy asserts that it does not (README.md).
//
// The broker is a private one with maxMessageSize 64 KiB, so that every client chunks the same way
// without a chunk-size option (Java 2.10.6 has none), unless CHUNKS_SERVICE_URL and
// CHUNKS_ADMIN_URL name a running broker started with that setting.
package chunks_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
)

// maxMessageSize is the private broker's maxMessageSize; messages of messageSize bytes are
// then sent as 3 chunks by every client.
const (
	maxMessageSize = 64 << 10
	messageSize    = 150_000
)

var broker *harness.Broker

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	svc, adm := os.Getenv("CHUNKS_SERVICE_URL"), os.Getenv("CHUNKS_ADMIN_URL")
	switch {
	case svc != "" && adm != "":
		b := harness.Attach(svc, adm, "")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := b.WaitReady(ctx)
		cancel()
		if err != nil {
			fmt.Fprintf(os.Stderr, "e2e/chunks: FAIL: broker %s is not ready: %v\n", adm, err)
			return 1
		}
		broker = b
		fmt.Fprintf(os.Stderr, "e2e/chunks: using the broker at %s (CHUNKS_SERVICE_URL; it must have maxMessageSize=%d)\n", svc, maxMessageSize)
	case svc != "" || adm != "":
		fmt.Fprintln(os.Stderr, "e2e/chunks: FAIL: set both CHUNKS_SERVICE_URL and CHUNKS_ADMIN_URL, or neither")
		return 1
	default:
		b, err := harness.StartBroker(harness.Options{MaxMessageSize: maxMessageSize})
		if err != nil {
			fmt.Fprintf(os.Stderr, "e2e/chunks: FAIL: no private broker: %v\n", err)
			return 1
		}
		broker = b
		fmt.Fprintf(os.Stderr, "e2e/chunks: private Apache Pulsar %s at %s, maxMessageSize=%d\n", b.Version, b.ServiceURL, maxMessageSize)
	}
	code := m.Run()
	printReport()
	if err := broker.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e/chunks: stopping the broker: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

var (
	reportMu sync.Mutex
	report   []string
)

// addReport records one line for the table printed after all tests.
func addReport(line string) {
	reportMu.Lock()
	report = append(report, line)
	reportMu.Unlock()
}

func printReport() {
	reportMu.Lock()
	defer reportMu.Unlock()
	if len(report) == 0 {
		return
	}
	fmt.Fprintf(os.Stderr, "\ne2e/chunks: results\n%s\n", strings.Join(report, "\n"))
}
