package fleet_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	plog "github.com/apache/pulsar-client-go/pulsar/log"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
)

// workload is one producer of the run: its topic's policy, how many messages, how it sends.
type workload struct {
	name     string // also the topic's name and the policy's
	n        int
	batching bool
	chunked  bool
	// counted while the run goes
	sent, acked, failed atomic.Int64
}

// chunkPayload makes each chunked message 3 chunks of at most chunkSize bytes.
const (
	chunkSize    = 25_000
	chunkPayload = 60_000
)

func (w *workload) message(i int) *pulsar.ProducerMessage {
	m := &pulsar.ProducerMessage{Key: "k" + strconv.Itoa(i%64),
		Properties: map[string]string{"i": strconv.Itoa(i), "region": []string{"us", "eu"}[(i/37)%2]}}
	if w.chunked {
		m.Payload = make([]byte, chunkPayload)
		copy(m.Payload, strconv.Itoa(i))
	} else {
		m.Payload = []byte("m-" + strconv.Itoa(i))
	}
	return m
}

// policies are the proxies' rules: one namespace per workload (base-name), so that moving one
// topic's bundle moves that topic alone; passthrough and chunked have no rule.
func policies(base string) string {
	return fmt.Sprintf(`policies:
  - topics: %[1]s-coalesce/coalesce
    policy: coalesce
    max_delay: 5ms
    split_keys: false
  - topics: %[1]s-properties/properties
    policy: properties
    max_delay: 5ms
    split_keys: false
    restricted: {region: [us, eu]}
  - topics: %[1]s-buckets/buckets
    policy: buckets
    max_delay: 5ms
    buckets: 4
`, base)
}

// fault is one step of the run, taken when every producer has sent at (fraction) of its
// messages, while they go on sending; a producer that reaches at+gateAfter before the step is
// done waits for it, so every step lands mid-stream however fast the sends go.
const gateAfter = 0.12

type fault struct {
	at   float64
	name string
	do   func(t *testing.T) string // returns what it did, for the report
}

// Given a two-broker cluster with de-duplication on for the namespace, three proxy processes
// behind HAProxy (TCP, round robin, health-checked every 250 ms), and five producers sending
// 20,000 messages through HAProxy (passthrough batched, coalesce unbatched, properties batched,
// buckets batched and keyed, and a chunking producer of 3-chunk messages), each topic placed on
// a broker, both brokers owning some,
// when, mid-stream, one instance is killed with -9 and restarted, then every topic is moved to
// the other broker, then another instance is killed with -9 and restarted,
// then every send is acknowledged, a consumer reading each topic straight from the brokers gets
// every message exactly once, the chunked topic holds 0 duplicate chunks and every chunked
// message whole, and each topic ends on the broker it was moved to.
func TestFleetBehindHAProxySurvivesKill9AndTopicMoves(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	admin := cluster.Brokers[0]
	base := fmt.Sprintf("public/fleet-%d", time.Now().UnixNano())
	works := []*workload{
		{name: "passthrough", n: 5000, batching: true},
		{name: "coalesce", n: 5000},
		{name: "properties", n: 4500, batching: true},
		{name: "buckets", n: 5000, batching: true},
		{name: "chunked", n: 500, chunked: true},
	}
	topic := func(w *workload) string { return "persistent://" + base + "-" + w.name + "/" + w.name }
	for _, w := range works {
		ns := base + "-" + w.name
		if err := admin.CreateNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
		if err := admin.SetNamespaceDeduplication(ctx, ns, true); err != nil {
			t.Fatal(err)
		}
	}

	// A subscription on each topic (never read: it keeps every entry), straight from the
	// brokers; creating it also creates the topic, which is then placed, alternately on the
	// two brokers.
	direct, err := pulsar.NewClient(pulsar.ClientOptions{URL: cluster.Brokers[0].ServiceURL, Logger: plog.DefaultNopLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	for i, w := range works {
		c, err := direct.Subscribe(pulsar.ConsumerOptions{Topic: topic(w), SubscriptionName: "keep",
			SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		moveTopic(t, ctx, topic(w), cluster.Brokers[i%2])
	}
	owners := func() string {
		var s []string
		for _, w := range works {
			s = append(s, w.name+"@"+ownerOf(t, ctx, topic(w)))
		}
		return strings.Join(s, " ")
	}
	placed := owners()

	var proxies []*harness.ProcessProxy
	var listens []string
	webs := cluster.Brokers[0].AdminURL + "," + cluster.Brokers[1].AdminURL
	for range 3 {
		p := harness.StartProcessProxyFor(t, cluster.ServiceURLs(), policies(base)+"broker-web-url: "+webs+"\n")
		proxies = append(proxies, p)
		listens = append(listens, p.Listen())
	}
	lb := harness.StartHAProxy(t, listens)

	var report []string
	kill := func(i int) func(t *testing.T) string {
		return func(t *testing.T) string {
			sentAtKill := make([]int64, len(works))
			unacked := int64(0)
			for k, w := range works {
				sentAtKill[k] = w.sent.Load()
				unacked += sentAtKill[k] - w.acked.Load() - w.failed.Load()
			}
			proxies[i].Kill9()
			killed := time.Now()
			time.Sleep(time.Second)
			proxies[i].StartRetrying(30 * time.Second)
			ready := time.Since(killed)
			settled := func() bool {
				for k, w := range works {
					if w.acked.Load()+w.failed.Load() < sentAtKill[k] {
						return false
					}
				}
				return true
			}
			for !settled() && time.Since(killed) < 3*time.Minute {
				time.Sleep(5 * time.Millisecond)
			}
			return fmt.Sprintf("kill -9 of instance %d with %d sends unacknowledged: restarted and ready %s after the kill; every send made before the kill acknowledged %s after it",
				i, unacked, ready.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
		}
	}
	faults := []fault{
		{0.3, "kill instance 0", kill(0)},
		{0.55, "move every topic", func(t *testing.T) string {
			start := time.Now()
			for i, w := range works {
				moveTopic(t, ctx, topic(w), cluster.Brokers[(i+1)%2])
			}
			return fmt.Sprintf("every topic moved to the other broker in %s: %s", time.Since(start).Round(time.Millisecond), owners())
		}},
		{0.8, "kill instance 1", kill(1)},
	}

	// Each producer has its own client, so their connections spread over the instances.
	var wg sync.WaitGroup
	gates := make([]chan struct{}, len(faults))
	reached := make([]sync.WaitGroup, len(faults))
	for i := range gates {
		gates[i] = make(chan struct{})
		reached[i].Add(len(works))
	}
	for _, w := range works {
		c, err := pulsar.NewClient(pulsar.ClientOptions{URL: "pulsar://" + lb.Addr, Logger: plog.DefaultNopLogger(),
			OperationTimeout: 60 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		opts := pulsar.ProducerOptions{Topic: topic(w), Name: "fleet-" + w.name, DisableBatching: !w.batching,
			BatchingMaxPublishDelay: 5 * time.Millisecond, MaxPendingMessages: 500, SendTimeout: 5 * time.Minute}
		if w.chunked {
			opts.EnableChunking, opts.ChunkMaxMessageSize, opts.MaxPendingMessages = true, chunkSize, 40
		}
		if w.name == "buckets" {
			opts.BatcherBuilderType = pulsar.KeyBasedBatchBuilder
		}
		prod, err := c.CreateProducer(opts)
		if err != nil {
			t.Fatalf("%s producer through HAProxy: %v", w.name, err)
		}
		defer prod.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			next, gated := 0, 0
			for i := 0; i < w.n; i++ {
				for next < len(faults) && i >= int(faults[next].at*float64(w.n)) {
					reached[next].Done()
					next++
				}
				for gated < len(faults) && i >= int((faults[gated].at+gateAfter)*float64(w.n)) {
					<-gates[gated]
					gated++
				}
				w.sent.Add(1)
				prod.SendAsync(ctx, w.message(i), func(_ pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
					if err != nil {
						w.failed.Add(1)
					} else {
						w.acked.Add(1)
					}
				})
			}
			for ; next < len(faults); next++ {
				reached[next].Done()
			}
			if err := prod.FlushWithCtx(ctx); err != nil {
				t.Errorf("%s: flush: %v", w.name, err)
			}
		}()
	}
	for i, f := range faults {
		reached[i].Wait()
		report = append(report, f.do(t))
		close(gates[i])
	}
	wg.Wait()
	for _, w := range works {
		for w.acked.Load()+w.failed.Load() < int64(w.n) && ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
	}

	total := 0
	for _, w := range works {
		total += w.n
		got, dups := readAll(t, ctx, direct, topic(w), w)
		line := fmt.Sprintf("%-11s %5d sent, %5d acked, %d failed; consumer: %5d distinct, %d duplicates",
			w.name, w.n, w.acked.Load(), w.failed.Load(), got, dups)
		if w.acked.Load() != int64(w.n) || w.failed.Load() != 0 {
			t.Errorf("%s: %d of %d acknowledged, %d failed", w.name, w.acked.Load(), w.n, w.failed.Load())
		}
		if got != w.n || dups != 0 {
			t.Errorf("%s: consumer got %d distinct of %d, %d duplicates; want each exactly once", w.name, got, w.n, dups)
		}
		if w.chunked {
			entries, err := admin.StoredEntries(ctx, topic(w))
			if err != nil {
				t.Fatal(err)
			}
			cc := harness.CountChunks(entries)
			dupChunks, incomplete, messages := cc.Duplicates, cc.Incomplete, cc.Messages
			line += fmt.Sprintf("; stored %d chunked messages, %d duplicate chunks, %d incomplete", messages, dupChunks, incomplete)
			if dupChunks != 0 || incomplete != 0 || messages != w.n {
				t.Errorf("chunked topic: %d messages, %d duplicate chunks, %d incomplete; want %d, 0, 0", messages, dupChunks, incomplete, w.n)
			}
		}
		report = append(report, line)
	}
	ended := owners()
	for i, w := range works {
		if want := hostPort(cluster.Brokers[(i+1)%2].AdminURL); ownerOf(t, ctx, topic(w)) != want {
			t.Errorf("%s: owned by %s at the end, want %s (where it was moved)", w.name, ownerOf(t, ctx, topic(w)), want)
		}
	}
	for i, p := range proxies {
		report = append(report, fmt.Sprintf("instance %d: %s", i, strings.ReplaceAll(p.MetricsText("rebatchproxy_chunk_recoveries_total"), "\n", " ")))
	}
	t.Logf("fleet run, %d messages, topics placed %s, ended %s:\n  %s", total, placed, ended, strings.Join(report, "\n  "))
}

// readAll reads topic from its first entry with a reader straight from the brokers until
// w.n distinct messages came and nothing more for 5 s (or nothing at all for 20 s), and
// returns the distinct count and the repeats.
func readAll(t *testing.T, ctx context.Context, c pulsar.Client, topic string, w *workload) (distinct, dups int) {
	r, err := c.CreateReader(pulsar.ReaderOptions{Topic: topic, StartMessageID: pulsar.EarliestMessageID()})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	seen := map[string]bool{}
	for {
		wait := 20 * time.Second
		if len(seen) >= w.n {
			wait = 5 * time.Second
		}
		rctx, cancel := context.WithTimeout(ctx, wait)
		m, err := r.Next(rctx)
		cancel()
		if err != nil {
			break
		}
		i := m.Properties()["i"]
		if w.chunked && len(m.Payload()) != chunkPayload {
			t.Errorf("chunked message %s: %d bytes, want %d", i, len(m.Payload()), chunkPayload)
		}
		if seen[i] {
			dups++
		}
		seen[i] = true
	}
	return len(seen), dups
}

func hostPort(u string) string {
	return strings.TrimPrefix(strings.TrimPrefix(u, "http://"), "https://")
}

// ownerOf returns the broker (web host:port) that owns topic, from an HTTP lookup.
func ownerOf(t *testing.T, ctx context.Context, topic string) string {
	t.Helper()
	var answer struct {
		HTTPURL string `json:"httpUrl"`
	}
	path := "/lookup/v2/topic/persistent/" + strings.TrimPrefix(topic, "persistent://")
	if err := getJSON(ctx, cluster.Brokers[0].AdminURL+path, &answer); err != nil {
		t.Fatalf("lookup %s: %v", topic, err)
	}
	return hostPort(answer.HTTPURL)
}

// moveTopic unloads topic's namespace bundle to broker to (PUT .../{bundle}/unload?
// destinationBroker=), and waits until a lookup names it.
func moveTopic(t *testing.T, ctx context.Context, topic string, to *harness.Broker) {
	t.Helper()
	rest := strings.TrimPrefix(topic, "persistent://")
	var bundle struct{ Range string }
	raw, err := getBody(ctx, cluster.Brokers[0].AdminURL+"/lookup/v2/topic/persistent/"+rest+"/bundle")
	if err != nil {
		t.Fatalf("bundle of %s: %v", topic, err)
	}
	bundle.Range = strings.Trim(strings.TrimSpace(string(raw)), `"`) // 4.0.8 answers the range unquoted
	ns := rest[:strings.LastIndex(rest, "/")]
	dest := hostPort(to.AdminURL)
	for deadline := time.Now().Add(60 * time.Second); ownerOf(t, ctx, topic) != dest; {
		if time.Now().After(deadline) {
			t.Fatalf("%s not on %s within 60 s", topic, dest)
		}
		if _, err := cluster.Brokers[0].Admin(ctx, http.MethodPut, "/admin/v2/namespaces/"+ns+"/"+bundle.Range+"/unload?destinationBroker="+dest, nil); err != nil {
			t.Logf("unload %s of %s to %s: %v (retrying)", bundle.Range, ns, dest, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func getJSON(ctx context.Context, url string, v any) error {
	b, err := getBody(ctx, url)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

func getBody(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("HTTP %d: %.200s", resp.StatusCode, b)
	}
	return b, err
}
