// This file is the same scenario through the proxy, whose producer path removes duplicate chunks
// (package chunkdedup, on by default): each chunk must be stored once. See README.md.

package chunks_test

import (
	"testing"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
)

// startProxy runs the proxy in-process in front of the test broker, with its defaults (chunk
// de-duplication is on under every policy, DESIGN.md section 2), and returns its host:port.
func startProxy(t *testing.T) string {
	t.Helper()
	px, err := harness.StartProxy(broker.ServiceURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(px.Stop)
	return px.Addr
}

// TestThroughProxyStoresEachChunkOnce: with the fault between the client and the proxy, the
// proxy answers resent chunks instead of forwarding them again.
func TestThroughProxyStoresEachChunkOnce(t *testing.T) {
	for _, p := range producers() {
		t.Run(p, func(t *testing.T) {
			// Given a chunking producer whose connection to the proxy goes through a relay that
			// cuts it after 2 chunks reached the broker but before their receipts reached the client
			px := startProxy(t)

			// When it sends 4 messages of 3 chunks each, reconnects to the proxy and resends
			o := runScenario(t, p, "proxy", px, "pulsar://"+px)

			// Then each chunk is stored once and the v0.18.0 consumer (through the proxy) receives
			// every message exactly once
			if o.Produce.Summary.Acked != messages {
				t.Errorf("producer acked %d/%d", o.Produce.Summary.Acked, messages)
			}
			if o.Chunks.Messages != messages || o.Chunks.Incomplete != 0 || o.Chunks.NotChunks != 0 {
				t.Errorf("topic holds %d messages (%d incomplete, %d entries that are not chunks), want %d complete chunked messages",
					o.Chunks.Messages, o.Chunks.Incomplete, o.Chunks.NotChunks, messages)
			}
			if o.Chunks.Duplicates != 0 {
				t.Errorf("%d duplicate chunks stored through the proxy: %v", o.Chunks.Duplicates, o.Chunks.DuplicatedUUIDs)
			}
			if c := o.Consumer; c.Distinct != messages || c.Repeated != 0 || c.Wrong != 0 {
				t.Errorf("%s consumer: %d distinct of %d, missing %v, %d repeated, %d wrong; want each message exactly once",
					consumerGo, c.Distinct, messages, c.Missing, c.Repeated, c.Wrong)
			}
		})
	}
}
