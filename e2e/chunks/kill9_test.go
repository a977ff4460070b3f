package chunks_test

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

// The proxy itself dies mid-chunk: its duplicate-chunk state dies with it, and the client
// resends, to the restarted process, every chunk whose receipt it had not seen, some of them
// already stored. The restarted proxy looks at the topic (chunk-recovery-entries, through
// broker-web-url) before it forwards; with the look off it forwards them all, as the broker
// alone would store them.

// kill9Run is one run: what the topic stored and what a consumer received.
type kill9Run struct {
	acked, failed int64
	chunks        chunkCount
	received      int // distinct whole messages a consumer received
	looks         string
	restart       time.Duration // from SIGKILL until the restarted proxy was ready
}

func (r kill9Run) String() string {
	return fmt.Sprintf("acked %d, failed %d; stored %d chunks of %d messages, %d duplicate chunks, %d incomplete; consumer got %d whole messages; restart %s; %s",
		r.acked, r.failed, r.chunks.Stored, r.chunks.Messages, r.chunks.Duplicates, r.chunks.Incomplete, r.received,
		r.restart.Round(time.Millisecond), r.looks)
}

// runKill9MidChunk sends n chunked messages (messageSize bytes, 3 chunks each) asynchronously
// from a pulsar-client-go (latest) producer with a fixed name, through a proxy process that
// is frozen for 300 ms and killed with SIGKILL (harness FreezeThenKill9) once a quarter of
// them are acknowledged, and started again on the same port after a second.
func runKill9MidChunk(t *testing.T, n int, moreYAML string) kill9Run {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ns := fmt.Sprintf("public/kill9-%d", time.Now().UnixNano())
	if err := broker.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if err := broker.SetNamespaceDeduplication(ctx, ns, true); err != nil {
		t.Fatal(err)
	}
	topic := "persistent://" + ns + "/t"
	direct, err := pulsar.NewClient(pulsar.ClientOptions{URL: broker.ServiceURL, Logger: plog.DefaultNopLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	cons, err := direct.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "check",
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()

	pp := harness.StartProcessProxy(t, broker, moreYAML)
	c, err := pulsar.NewClient(pulsar.ClientOptions{URL: pp.URL(), Logger: plog.DefaultNopLogger(), OperationTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	prod, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic, Name: "kill9-producer", EnableChunking: true,
		DisableBatching: true, MaxPendingMessages: 40, SendTimeout: 3 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()

	var run kill9Run
	var acked, failed atomic.Int64
	var wg sync.WaitGroup
	killed := make(chan struct{})
	go func() {
		for acked.Load() < int64(n/4) {
			time.Sleep(time.Millisecond)
		}
		pp.FreezeThenKill9(300 * time.Millisecond)
		start := time.Now()
		time.Sleep(time.Second)
		pp.StartRetrying(30 * time.Second)
		run.restart = time.Since(start)
		close(killed)
	}()
	payload := make([]byte, messageSize)
	for i := 0; i < n; i++ {
		wg.Add(1)
		prod.SendAsync(ctx, &pulsar.ProducerMessage{Payload: payload, Properties: map[string]string{"i": strconv.Itoa(i)}},
			func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
				if err != nil {
					failed.Add(1)
				} else {
					acked.Add(1)
				}
				wg.Done()
			})
	}
	wg.Wait()
	<-killed
	run.acked, run.failed = acked.Load(), failed.Load()

	entries, err := broker.StoredEntries(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	run.chunks = countChunks(entries)
	seen := map[string]bool{}
	for len(seen) < n {
		rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
		m, err := cons.Receive(rctx)
		rcancel()
		if err != nil {
			break // counted below
		}
		if len(m.Payload()) == messageSize {
			seen[m.Properties()["i"]] = true
		}
		_ = cons.Ack(m)
	}
	run.received = len(seen)
	run.looks = pp.MetricsText("rebatchproxy_chunk_recover")
	return run
}

// Given broker de-duplication on and a chunking producer sending 120 messages of 3 chunks
// through a proxy process,
// when the proxy is frozen and killed with SIGKILL mid-stream and restarted on the same port,
// then with the look at the topic (broker-web-url given) every message is stored exactly once,
// with 0 duplicate chunks, and consumed whole; while the same run with the look off
// (chunk-recovery-entries: 0, the proxy before the look) stores duplicate chunks (the control).
func TestKill9ProxyMidChunkStoresNoDuplicateChunks(t *testing.T) {
	const n = 120
	withLook := runKill9MidChunk(t, n, "broker-web-url: "+broker.AdminURL+"\n")
	without := runKill9MidChunk(t, n, "broker-web-url: "+broker.AdminURL+"\nchunk-recovery-entries: 0\n")
	t.Logf("with the look:    %v", withLook)
	t.Logf("without the look: %v", without)
	addReport(fmt.Sprintf("kill -9 of the proxy mid-chunk, %d messages of 3 chunks, dedup on: with the look %d duplicate chunks, without it %d",
		n, withLook.chunks.Duplicates, without.chunks.Duplicates))

	if without.chunks.Duplicates == 0 {
		t.Errorf("without the look no chunk was stored twice: the kill did not land mid-chunk, the run shows nothing")
	}
	if withLook.acked != n || withLook.failed != 0 {
		t.Errorf("producer: %d acked, %d failed of %d", withLook.acked, withLook.failed, n)
	}
	if withLook.chunks.Messages != n || withLook.chunks.Incomplete != 0 || withLook.chunks.Duplicates != 0 {
		t.Errorf("topic: %d messages, %d incomplete, %d duplicate chunks %v; want %d, 0, 0",
			withLook.chunks.Messages, withLook.chunks.Incomplete, withLook.chunks.Duplicates, withLook.chunks.DuplicatedUUIDs, n)
	}
	if withLook.received != n {
		t.Errorf("consumer got %d of %d messages whole", withLook.received, n)
	}
}
