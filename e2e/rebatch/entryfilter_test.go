package rebatch_test

import (
	"context"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/rebatch"
)

// buildRegionFilter compiles testdata/entryfilter/RegionFilter.java against the broker
// distribution's own jars (the API the broker runs, no download) and packages it as the NAR
// the broker loads from entryFiltersDirectory: the classes and META-INF/services/
// entry_filter.yml at the archive's root. It returns the directory holding region.nar.
func buildRegionFilter(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	home, err := harness.PulsarHome(ctx)
	if err != nil {
		t.Fatal(err)
	}
	src, err := filepath.Abs("testdata/entryfilter")
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	classes, nars := filepath.Join(work, "classes"), filepath.Join(work, "filters")
	for _, d := range []string{filepath.Join(classes, "META-INF", "services"), nars} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	def, err := os.ReadFile(filepath.Join(src, "META-INF", "services", "entry_filter.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(classes, "META-INF", "services", "entry_filter.yml"), def, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range [][]string{
		{"javac", "-nowarn", "-cp", filepath.Join(home, "lib", "*"), "-d", classes, filepath.Join(src, "RegionFilter.java")},
		{"jar", "cf", filepath.Join(nars, "region.nar"), "-C", classes, "."},
	} {
		out, err := exec.CommandContext(ctx, cmd[0], cmd[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", cmd, err, out)
		}
	}
	return nars
}

// filterRun is what a subscription whose entry filter rejects region eu received.
type filterRun struct {
	us, eu   int // messages received, by region
	sentUS   int
	entries  int
	mixedEnt int // stored entries mixing regions
}

// runRegionFilter subscribes with reject-region=eu on the broker, sends msgs through url with
// default batching, and counts what the subscription received until it has been quiet for 3 s.
func runRegionFilter(t *testing.T, b *harness.Broker, url, topic string, regions []string) filterRun {
	t.Helper()
	cons, err := newClient(t, b.ServiceURL).Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "no-eu",
		Type: pulsar.Shared, SubscriptionProperties: map[string]string{"reject-region": "eu"},
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	prod, err := newClient(t, url).CreateProducer(pulsar.ProducerOptions{Topic: topic, BatchingMaxPublishDelay: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var run filterRun
	msgs := make([]*pulsar.ProducerMessage, len(regions))
	for i, r := range regions {
		msgs[i] = &pulsar.ProducerMessage{Payload: []byte("m-" + strconv.Itoa(i)), Properties: map[string]string{"region": r}}
		if r == "us" {
			run.sentUS++
		}
	}
	sendAll(t, prod, msgs)
	prod.Close()
	for quiet := time.After(3 * time.Second); ; {
		select {
		case m := <-cons.Chan():
			switch m.Properties()["region"] {
			case "us":
				run.us++
			case "eu":
				run.eu++
			}
			_ = cons.Ack(m)
			quiet = time.After(3 * time.Second)
			continue
		case <-quiet:
		}
		break
	}
	entries, err := b.StoredEntries(ctxT(t, time.Minute), topic)
	if err != nil {
		t.Fatal(err)
	}
	run.entries = len(entries)
	for _, e := range entries {
		for _, m := range e.Messages {
			if m.Properties["region"] != e.Messages[0].Properties["region"] {
				run.mixedEnt++
				break
			}
		}
	}
	return run
}

// Given a broker running a real entry filter (testdata/entryfilter/RegionFilter.java, loaded
// from a NAR) that rejects entries whose outer property region equals the subscription's
// reject-region, and a subscription with reject-region=eu,
// when a pulsar-client-go producer with default batching sends 2,000 messages whose region is
// us or eu at random, directly and through the proxy's properties policy (restricted: region),
// then through the proxy the subscription receives exactly the us messages and no eu message;
// directly, client batches mix regions and are judged whole, so us messages are dropped with
// eu ones or eu messages get through.
func TestEntryFilterJudgesEntriesByStampedProperties(t *testing.T) {
	nars := buildRegionFilter(t)
	b, err := harness.StartBroker(harness.Options{ExtraConf: "entryFiltersDirectory=" + nars + "\nentryFilterNames=region"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop() })
	rnd := rand.New(rand.NewSource(191))
	regions := make([]string, 2000)
	for i := range regions {
		regions[i] = []string{"us", "eu"}[rnd.Intn(2)]
	}
	ns := newNamespace(t, b, "filter")
	url := startProxy(t, b, ns, rebatch.Policy{Kind: rebatch.Properties, MaxDelay: 5 * time.Millisecond,
		Restricted: map[string][]string{"region": {"us", "eu"}}})
	direct := runRegionFilter(t, b, b.ServiceURL, "persistent://"+ns+"/direct", regions)
	proxied := runRegionFilter(t, b, url, "persistent://"+ns+"/proxied", regions)
	for _, r := range []struct {
		name string
		run  filterRun
	}{{"direct", direct}, {"through proxy", proxied}} {
		t.Logf("%-13s: %d entries (%d mixing regions); the reject-region=eu subscription received %d of %d us messages and %d eu messages",
			r.name, r.run.entries, r.run.mixedEnt, r.run.us, r.run.sentUS, r.run.eu)
	}
	if proxied.us != proxied.sentUS || proxied.eu != 0 || proxied.mixedEnt != 0 {
		t.Fatalf("through the proxy: %d of %d us and %d eu received, %d entries mixing regions; want all us, 0 eu, 0 mixed",
			proxied.us, proxied.sentUS, proxied.eu, proxied.mixedEnt)
	}
	if direct.eu == 0 && direct.us == direct.sentUS {
		t.Fatalf("directly the filter was exact too (%d us, 0 eu): the workload does not exercise mixed batches", direct.us)
	}
}
