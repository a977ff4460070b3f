package fleet_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	plog "github.com/apache/pulsar-client-go/pulsar/log"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
)

// singleKill sends n chunked messages from one producer through a single proxy process in
// front of the cluster, freezes the proxy for 300 ms and kills it with -9 once a quarter are acknowledged (harness FreezeThenKill9: what was in flight is stored unanswered), restarts it
// on the same port after a second, and returns the duplicate and incomplete chunks stored.
func singleKill(t *testing.T, ctx context.Context, n int, moreYAML string) (dups, incomplete, messages int, acked int64) {
	t.Helper()
	admin := cluster.Brokers[0]
	ns := fmt.Sprintf("public/single-%d", time.Now().UnixNano())
	if err := admin.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if err := admin.SetNamespaceDeduplication(ctx, ns, true); err != nil {
		t.Fatal(err)
	}
	topic := "persistent://" + ns + "/chunked"
	direct, err := pulsar.NewClient(pulsar.ClientOptions{URL: admin.ServiceURL, Logger: plog.DefaultNopLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	keep, err := direct.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "keep"})
	if err != nil {
		t.Fatal(err)
	}
	keep.Close()

	webs := cluster.Brokers[0].AdminURL + "," + cluster.Brokers[1].AdminURL
	pp := harness.StartProcessProxyFor(t, cluster.ServiceURLs(), "broker-web-url: "+webs+"\n"+moreYAML)
	c, err := pulsar.NewClient(pulsar.ClientOptions{URL: pp.URL(), Logger: plog.DefaultNopLogger(), OperationTimeout: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	prod, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic, Name: "single-chunked", EnableChunking: true,
		ChunkMaxMessageSize: chunkSize, DisableBatching: true, MaxPendingMessages: 40, SendTimeout: 3 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	var ok, failed atomic.Int64
	var wg sync.WaitGroup
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		for ok.Load() < int64(n/4) && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		pp.FreezeThenKill9(300 * time.Millisecond)
		time.Sleep(time.Second)
		pp.StartRetrying(30 * time.Second)
	}()
	for i := 0; i < n; i++ {
		wg.Add(1)
		payload := make([]byte, chunkPayload)
		copy(payload, strconv.Itoa(i))
		prod.SendAsync(ctx, &pulsar.ProducerMessage{Payload: payload}, func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
			if err != nil {
				failed.Add(1)
			} else {
				ok.Add(1)
			}
			wg.Done()
		})
	}
	wg.Wait()
	<-killed
	if failed.Load() != 0 {
		t.Errorf("%d sends failed", failed.Load())
	}
	entries, err := admin.StoredEntries(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	dups, incomplete, messages = countChunks(entries)
	return dups, incomplete, messages, ok.Load()
}

// Given the cluster, de-duplication on, and a single proxy process in front of it,
// when a chunking producer's proxy is frozen and killed with -9 mid-stream and restarted,
// then with the look at the topic 0 duplicate chunks are stored and every message is whole,
// while the same run with the look off (chunk-recovery-entries: 0) stores duplicates (the
// control: without them the kill did not land mid-chunk).
func TestSingleProxyKilledMidChunkOnTheCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	const n = 120
	dups, incomplete, messages, acked := singleKill(t, ctx, n, "")
	offDups, _, _, _ := singleKill(t, ctx, n, "chunk-recovery-entries: 0\n")
	t.Logf("single proxy killed mid-chunk on the cluster, %d messages of 3 chunks: with the look %d duplicate chunks (%d messages stored, %d incomplete, %d acked); without it %d duplicate chunks",
		n, dups, messages, incomplete, acked, offDups)
	if offDups == 0 {
		t.Errorf("without the look no chunk was stored twice: the kill did not land mid-chunk, the run shows nothing")
	}
	if dups != 0 || incomplete != 0 || messages != n || acked != n {
		t.Errorf("with the look: %d duplicate chunks, %d incomplete, %d messages stored, %d acked; want 0, 0, %d, %d",
			dups, incomplete, messages, acked, n, n)
	}
}
