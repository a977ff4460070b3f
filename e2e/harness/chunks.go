package harness

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

	"github.com/rebatchproxy/rebatchproxy/e2e/faultrelay"
	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// ChunkCount is what a stored topic holds of chunked messages.
type ChunkCount struct {
	Entries    int
	Messages   int // distinct uuids
	Stored     int // chunk entries
	Duplicates int // chunk entries beyond the first copy of each (uuid, chunk id)
	Incomplete int // uuids missing a chunk id in 0..num_chunks-1
	NotChunks  int // entries without chunk metadata
	// DuplicatedUUIDs lists the uuids with a duplicate chunk and how their chunk ids were stored.
	DuplicatedUUIDs map[string][]int
}

// CountChunks counts a topic's stored entries (Broker.StoredEntries) by chunk: a duplicate
// chunk is the same (uuid, chunk_id) stored more than once.
func CountChunks(entries []StoredEntry) ChunkCount {
	c := ChunkCount{Entries: len(entries), DuplicatedUUIDs: map[string][]int{}}
	order := map[string][]int{}
	total := map[string]int{}
	seen := map[string]map[int]int{}
	for _, e := range entries {
		if e.ChunkID < 0 || e.UUID == "" {
			c.NotChunks++
			continue
		}
		c.Stored++
		if seen[e.UUID] == nil {
			seen[e.UUID] = map[int]int{}
		}
		seen[e.UUID][e.ChunkID]++
		if seen[e.UUID][e.ChunkID] > 1 {
			c.Duplicates++
		}
		order[e.UUID] = append(order[e.UUID], e.ChunkID)
		total[e.UUID] = e.NumChunksFromMsg
	}
	c.Messages = len(seen)
	for u, ids := range seen {
		for i := 0; i < total[u]; i++ {
			if ids[i] == 0 {
				c.Incomplete++
				break
			}
		}
		for _, n := range ids {
			if n > 1 {
				c.DuplicatedUUIDs[u] = order[u]
				break
			}
		}
	}
	return c
}

// MidChunkKill is one run of a chunking producer whose proxy process dies mid-chunk: n
// messages of Size bytes (two chunks or more each) sent asynchronously (40 pending at most) by a
// pulsar-client-go producer with a fixed name through a fault relay in front of Proxy. Once a
// quarter of the messages have gone, the relay forwards the first chunk of the next message and
// nothing more, waits until the proxy has answered every send it forwarded (so the broker has
// stored them), withholding from the client the receipts that had not reached it when that chunk
// went (the chunks then in flight and that chunk); then the proxy is killed with -9 and started
// again on the same port a second later. The client resends every chunk whose receipt it had
// not seen: messages stored whole, and a message whose first chunk alone is stored. (Holding
// receipts any earlier would let the producer's 40 pending chunks fill before that chunk is
// sent: a stall, not a kill.) The kill lands mid-chunk by
// construction, not by the moment a signal happens to arrive (a run that left it to chance
// stored no duplicate even without the proxy's look, once in a CI run).
type MidChunkKill struct {
	Admin        *Broker       // creates the namespace (de-duplication on) and reads the topic back
	Proxy        *ProcessProxy // started by the caller
	Namespace    string        // prefix of the run's fresh namespace, e.g. "public/kill9"
	Messages     int
	Size         int // payload bytes
	ChunkSize    int // the producer's ChunkMaxMessageSize; 0: the broker's maxMessageSize
	ProducerName string
}

// MidChunkResult is what the run's producer was told, what the topic stored and what a consumer
// subscribed directly before the run received.
type MidChunkResult struct {
	Acked, Failed int64
	Chunks        ChunkCount
	Received      int           // distinct whole messages the consumer received
	Restart       time.Duration // from the kill until the restarted proxy was ready
	Looks         string        // the restarted proxy's rebatchproxy_chunk_recover* metrics
}

func (r MidChunkResult) String() string {
	return fmt.Sprintf("acked %d, failed %d; stored %d chunks of %d messages, %d duplicate chunks, %d incomplete; consumer got %d whole messages; restart %s; %s",
		r.Acked, r.Failed, r.Chunks.Stored, r.Chunks.Messages, r.Chunks.Duplicates, r.Chunks.Incomplete, r.Received,
		r.Restart.Round(time.Millisecond), r.Looks)
}

// firstChunks matches the SEND frames that carry a message's first chunk.
func firstChunks(f wire.Frame, md *pulsarpb.MessageMetadata) bool {
	return faultrelay.ChunkSends(f, md) && md.GetChunkId() == 0
}

// Run runs it; a setup failure fails t.
func (k MidChunkKill) Run(t *testing.T) MidChunkResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ns := fmt.Sprintf("%s-%d", k.Namespace, time.Now().UnixNano())
	if err := k.Admin.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if err := k.Admin.SetNamespaceDeduplication(ctx, ns, true); err != nil {
		t.Fatal(err)
	}
	topic := "persistent://" + ns + "/chunked"
	direct, err := pulsar.NewClient(pulsar.ClientOptions{URL: k.Admin.ServiceURL, Logger: plog.DefaultNopLogger()})
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

	quarter := k.Messages / 4
	atPoint, killedAt := make(chan struct{}), make(chan struct{})
	relay, err := faultrelay.Start(faultrelay.Config{Upstream: k.Proxy.Listen(), RewriteLookups: true,
		Rule: &faultrelay.Rule{Match: firstChunks, After: quarter + 1, HoldFrom: quarter + 1, Drain: 30 * time.Second,
			BeforeClose: func() { close(atPoint); <-killedAt }}})
	if err != nil {
		t.Fatal(err)
	}
	defer relay.Close()

	c, err := pulsar.NewClient(pulsar.ClientOptions{URL: relay.URL(), Logger: plog.DefaultNopLogger(), OperationTimeout: 60 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	prod, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic, Name: k.ProducerName, EnableChunking: true,
		ChunkMaxMessageSize: uint(k.ChunkSize), DisableBatching: true, MaxPendingMessages: 40, SendTimeout: 3 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()

	var r MidChunkResult
	var acked, failed atomic.Int64
	var wg sync.WaitGroup
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		select {
		case <-atPoint:
		case <-ctx.Done():
			t.Errorf("the relay never reached the first chunk of message %d: %v", quarter, relay.Cuts())
			return
		}
		k.Proxy.Kill9()
		close(killedAt)
		start := time.Now()
		time.Sleep(time.Second)
		k.Proxy.StartRetrying(30 * time.Second)
		r.Restart = time.Since(start)
	}()
	payload := make([]byte, k.Size)
	for i := 0; i < k.Messages; i++ {
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
	r.Acked, r.Failed = acked.Load(), failed.Load()
	if cuts := relay.Cuts(); len(cuts) != 1 || !cuts[0].Drained {
		t.Errorf("the relay's cut: %v; want one, with every forwarded send answered before the kill", cuts)
	}

	entries, err := k.Admin.StoredEntries(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	r.Chunks = CountChunks(entries)
	seen := map[string]bool{}
	for len(seen) < k.Messages {
		rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
		m, err := cons.Receive(rctx)
		rcancel()
		if err != nil {
			break // counted by the caller: Received < Messages
		}
		if len(m.Payload()) == k.Size {
			seen[m.Properties()["i"]] = true
		}
		_ = cons.Ack(m)
	}
	r.Received = len(seen)
	r.Looks = k.Proxy.MetricsText("rebatchproxy_chunk_recover")
	return r
}
