package fleet_test

import (
	"testing"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
)

// singleKill is one harness.MidChunkKill run through a single proxy process in front of the
// cluster: 120 messages of 3 chunks.
func singleKill(t *testing.T, moreYAML string) harness.MidChunkResult {
	webs := cluster.Brokers[0].AdminURL + "," + cluster.Brokers[1].AdminURL
	pp := harness.StartProcessProxyFor(t, cluster.ServiceURLs(), "broker-web-url: "+webs+"\n"+moreYAML)
	return harness.MidChunkKill{Admin: cluster.Brokers[0], Proxy: pp, Namespace: "public/single", Messages: 120,
		Size: chunkPayload, ChunkSize: chunkSize, ProducerName: "single-chunked"}.Run(t)
}

// Given the cluster, de-duplication on, and a single proxy process in front of it,
// when a chunking producer's proxy is frozen and killed with -9 mid-stream and restarted,
// then with the look at the topic 0 duplicate chunks are stored and every message is whole,
// while the same run with the look off (chunk-recovery-entries: 0) stores duplicates (the
// control: without them the kill did not land mid-chunk).
func TestSingleProxyKilledMidChunkOnTheCluster(t *testing.T) {
	const n = 120
	look := singleKill(t, "")
	off := singleKill(t, "chunk-recovery-entries: 0\n")
	t.Logf("single proxy killed mid-chunk on the cluster, %d messages of 3 chunks:\n  with the look:    %v\n  without the look: %v", n, look, off)
	if off.Chunks.Duplicates == 0 {
		t.Errorf("without the look no chunk was stored twice: the kill did not land mid-chunk, the run shows nothing")
	}
	if look.Chunks.Duplicates != 0 || look.Chunks.Incomplete != 0 || look.Chunks.Messages != n || look.Acked != n || look.Failed != 0 || look.Received != n {
		t.Errorf("with the look: %d duplicate chunks %v, %d incomplete, %d messages stored, %d acked, %d failed, %d consumed whole; want 0, 0, %d, %d, 0, %d",
			look.Chunks.Duplicates, look.Chunks.DuplicatedUUIDs, look.Chunks.Incomplete, look.Chunks.Messages, look.Acked, look.Failed, look.Received, n, n, n)
	}
}
