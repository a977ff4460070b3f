package chunks_test

import (
	"fmt"
	"testing"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
)

// The proxy itself dies mid-chunk: its duplicate-chunk state dies with it, and the client
// resends, to the restarted process, every chunk whose receipt it had not seen, some of them
// already stored. The restarted proxy looks at the topic (chunk-recovery-entries, through
// broker-web-url) before it forwards; with the look off it forwards them all, as the broker
// alone would store them.

// Given broker de-duplication on and a chunking producer sending 120 messages of 3 chunks
// through a proxy process,
// when the proxy is frozen and killed with SIGKILL mid-stream and restarted on the same port,
// then with the look at the topic (broker-web-url given) every message is stored exactly once,
// with 0 duplicate chunks, and consumed whole; while the same run with the look off
// (chunk-recovery-entries: 0, the proxy before the look) stores duplicate chunks (the control).
func TestKill9ProxyMidChunkStoresNoDuplicateChunks(t *testing.T) {
	const n = 120
	run := func(moreYAML string) harness.MidChunkResult {
		return harness.MidChunkKill{Admin: broker, Proxy: harness.StartProcessProxy(t, broker, moreYAML), Namespace: "public/kill9",
			Messages: n, Size: messageSize, ProducerName: "kill9-producer"}.Run(t)
	}
	withLook := run("broker-web-url: " + broker.AdminURL + "\n")
	without := run("broker-web-url: " + broker.AdminURL + "\nchunk-recovery-entries: 0\n")
	t.Logf("with the look:    %v", withLook)
	t.Logf("without the look: %v", without)
	addReport(fmt.Sprintf("kill -9 of the proxy mid-chunk, %d messages of 3 chunks, dedup on: with the look %d duplicate chunks, without it %d",
		n, withLook.Chunks.Duplicates, without.Chunks.Duplicates))

	if without.Chunks.Duplicates == 0 {
		t.Errorf("without the look no chunk was stored twice: the kill did not land mid-chunk, the run shows nothing")
	}
	if withLook.Acked != n || withLook.Failed != 0 {
		t.Errorf("producer: %d acked, %d failed of %d", withLook.Acked, withLook.Failed, n)
	}
	if withLook.Chunks.Messages != n || withLook.Chunks.Incomplete != 0 || withLook.Chunks.Duplicates != 0 {
		t.Errorf("topic: %d messages, %d incomplete, %d duplicate chunks %v; want %d, 0, 0",
			withLook.Chunks.Messages, withLook.Chunks.Incomplete, withLook.Chunks.Duplicates, withLook.Chunks.DuplicatedUUIDs, n)
	}
	if withLook.Received != n {
		t.Errorf("consumer got %d of %d messages whole", withLook.Received, n)
	}
}
