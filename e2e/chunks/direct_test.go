package chunks_test

import (
	"testing"
)

// TestDirectReproducesDuplicateChunks is the reproduction of the PIP-295 failure without the
// proxy. It passes when the failure happens: the topic holds duplicate chunks.
func TestDirectReproducesDuplicateChunks(t *testing.T) {
	for _, p := range producers() {
		t.Run(p, func(t *testing.T) {
			// Given a chunking producer whose connection to the broker goes through a relay that
			// cuts it after 2 chunks reached the broker but before their receipts reached the client
			up := hostPort(t, broker.ServiceURL)

			// When it sends 4 messages of 3 chunks each, reconnects and resends
			o := runScenario(t, p, "direct", up, broker.ServiceURL)

			// Then every message was acknowledged to the producer and is complete in the topic,
			// but the topic holds duplicate chunks and the v0.18.0 consumer loses a message
			if o.Produce.Summary.Acked != messages {
				t.Errorf("producer acked %d/%d: it did not recover from the cut", o.Produce.Summary.Acked, messages)
			}
			if o.Chunks.Messages != messages || o.Chunks.Incomplete != 0 || o.Chunks.NotChunks != 0 {
				t.Errorf("topic holds %d messages (%d incomplete, %d entries that are not chunks), want %d complete chunked messages",
					o.Chunks.Messages, o.Chunks.Incomplete, o.Chunks.NotChunks, messages)
			}
			if o.Chunks.Duplicates == 0 {
				t.Errorf("no duplicate chunk stored: the failure was NOT reproduced")
			}
			if c := o.Consumer; len(c.Missing)+c.Repeated+c.Wrong == 0 {
				t.Errorf("the %s consumer delivered every message exactly once: the consumer-side failure was NOT reproduced", consumerGo)
			}
		})
	}
}
