package rebatch_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rebatchproxy/rebatchproxy/e2e/drivers"
	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/rebatch"
)

// legacyDrivers are the released clients the issue names: pulsar-client-go v0.8.1, v0.14.0 and
// the latest, Java 2.10.x and Python latest.
var legacyDrivers = []string{"go-v0.8.1", "go-v0.14.0", "go-v0.21.0", "java-2.10.6", "python-3.13.0"}

// legacyRun is one produce run of a legacy driver and the messages it sends.
type legacyRun struct {
	name  string
	count int
	spec  drivers.ProduceSpec // URL and Topic filled in by the test
	// props returns the properties message i of this run is sent with.
	props func(i int) map[string]string
}

// driverProps expands a driver properties template ("k=v,...", {i} and {i%N}) as the drivers do.
func driverProps(tmpl string, i int) map[string]string {
	out := map[string]string{}
	for _, kv := range strings.Split(tmpl, ",") {
		k, v, _ := strings.Cut(kv, "=")
		for {
			a := strings.Index(v, "{i")
			if a < 0 {
				break
			}
			b := strings.Index(v[a:], "}")
			x := i
			if mod := v[a+2 : a+b]; strings.HasPrefix(mod, "%") {
				m, _ := strconv.Atoi(mod[1:])
				x = i % m
			}
			v = v[:a] + strconv.Itoa(x) + v[a+b+1:]
		}
		out[k] = v
	}
	return out
}

func templated(name string, count int, spec drivers.ProduceSpec) legacyRun {
	tmpl := spec.Properties
	spec.Count = count
	return legacyRun{name: name, count: count, spec: spec, props: func(i int) map[string]string { return driverProps(tmpl, i) }}
}

// legacyGroup is a message's restricted properties under the policy of these tests
// (region: ['0', '1', us]); it is also what the entry's outer properties must be.
func legacyGroup(props map[string]string) string {
	switch v := props["region"]; v {
	case "0", "1", "us":
		return "region=" + v
	}
	return ""
}

// Given the proxy with the properties policy (region: '0', '1', us) merging across keys, and for each legacy client
// (pulsar-client-go v0.8.1, v0.14.0, v0.21.0, Java 2.10.6, Python 3.13.0) a producer batching
// with the client's defaults,
// when the client's driver sends through the proxy 300 messages all in region us, then 300
// whose region cycles 0, 1, 2 (2 is not admitted),
// then every stored entry is a batch whose messages share one group, equal to its outer
// properties, and each carry a sequence id of their own, the broker stores each message once in producer order, and the same client,
// consuming through the proxy, receives each message once, in producer order, with its own
// properties.
func TestLegacyClientsThroughPropertiesPolicy(t *testing.T) {
	runs := []legacyRun{
		templated("one-group", 300, drivers.ProduceSpec{Properties: "run=one-group,i={i},region=us", KeyMode: "seq", Keys: 5}),
		templated("cycling", 300, drivers.ProduceSpec{Properties: "run=cycling,i={i},region={i%3}", KeyMode: "seq", Keys: 5}),
	}
	// Keys cycle on every message, so entries merge across keys (split_keys: false), as in
	// TestLegacyClientsThroughCoalescePolicy.
	mixKeys := false
	testLegacy(t, rebatch.Policy{Kind: rebatch.Properties, MaxDelay: 5 * time.Millisecond, SplitKeys: &mixKeys,
		Restricted: map[string][]string{"region": {"0", "1", "us"}}}, runs)
}

// Given the proxy with the coalesce policy merging across keys, and for each legacy client (pulsar-client-go v0.8.1,
// v0.14.0, v0.21.0, Java 2.10.6, Python 3.13.0) a producer with batching off,
// when the client's driver sends 500 messages asynchronously through the proxy,
// then the broker stores them in at most half as many entries, each message once and in
// producer order, and the same client, consuming through the proxy, receives each message once,
// in producer order, with its own key and properties.
func TestLegacyClientsThroughCoalescePolicy(t *testing.T) {
	runs := []legacyRun{
		templated("unbatched", 500, drivers.ProduceSpec{Batching: drivers.Bool(false), Properties: "run=unbatched,i={i}", KeyMode: "seq", Keys: 5}),
	}
	// Keys cycle on every message, so entries merge across keys (split_keys: false); key
	// routing is TestKeySharedDeliveryUnderRewritingPolicies's subject.
	mixKeys := false
	testLegacy(t, rebatch.Policy{Kind: rebatch.Coalesce, MaxDelay: 5 * time.Millisecond, SplitKeys: &mixKeys}, runs)
}

func testLegacy(t *testing.T, pol rebatch.Policy, runs []legacyRun) {
	b := harness.Default(t)
	for _, name := range legacyDrivers {
		t.Run(name, func(t *testing.T) {
			d, err := drivers.ByName(name)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			if err := d.Prepare(ctx); err != nil {
				t.Fatal(err)
			}
			ns := newNamespace(t, b, "legacy-"+strings.ReplaceAll(name, ".", "-"))
			url := startProxy(t, b, ns, pol)
			topic := "persistent://" + ns + "/t"

			// The messages in producer order: run name and index.
			type ref struct {
				run string
				i   int
			}
			var order []ref
			props := map[ref]map[string]string{}
			for _, r := range runs {
				spec := r.spec
				spec.URL, spec.Topic = url, topic
				res, err := d.Produce(ctx, spec)
				if err != nil {
					t.Fatalf("produce %s: %v", r.name, err)
				}
				if len(res.Acks) != r.count || len(res.Errors) != 0 {
					t.Fatalf("produce %s: %d acks, %d errors for %d messages", r.name, len(res.Acks), len(res.Errors), r.count)
				}
				for i := 0; i < r.count; i++ {
					order = append(order, ref{r.name, i})
					props[ref{r.name, i}] = r.props(i)
				}
			}

			// What the broker stored.
			entries, err := b.StoredEntries(ctx, topic)
			if err != nil {
				t.Fatal(err)
			}
			// pulsar-client-go before v0.10 gives a batch one sequence id, so the proxy never cuts
			// such a batch (see rebatch/doc.go): one that mixes groups is stored as the client
			// built it, outer properties being its first message's (the Go client's own).
			numbersBatches := name == "go-v0.8.1"
			clientBuilt := 0
			next := 0
			for _, e := range entries {
				group := ""
				mixed := false
				for j, m := range e.Messages {
					got := ref{m.Properties["run"], -1}
					got.i, _ = strconv.Atoi(m.Properties["i"])
					if next >= len(order) || got != order[next] {
						t.Fatalf("entry %d:%d record %d is %v, want message %d of %d in producer order (%v)",
							e.Ledger, e.Entry, j, got, next, len(order), order[min(next, len(order)-1)])
					}
					next++
					if mapString(m.Properties) != mapString(props[got]) {
						t.Fatalf("%v stored with properties %v, sent %v", got, m.Properties, props[got])
					}
					if want := "msg-" + strconv.Itoa(got.i); !strings.HasPrefix(string(m.Payload), want) {
						t.Fatalf("%v stored with payload %q", got, m.Payload)
					}
					if pol.Kind == rebatch.Properties {
						g := legacyGroup(m.Properties)
						if j == 0 {
							group = g
						} else if g != group {
							mixed = true
							if !numbersBatches {
								t.Fatalf("entry %d:%d mixes groups %q and %q", e.Ledger, e.Entry, group, g)
							}
						}
					}
				}
				if pol.Kind == rebatch.Properties && numbersBatches && mixed {
					if got, want := mapString(e.Properties), mapString(e.Messages[0].Properties); got != want {
						t.Fatalf("entry %d:%d mixes groups but is not the client's own batch: outer %q, first message %q", e.Ledger, e.Entry, got, want)
					}
					clientBuilt++
					continue
				}
				// A consumer reads the entry's outer sequence id for a message without one of its
				// own, and in an entry the proxy built that is the first send's: every message
				// there carries its own (a batch numbered as one, its batch's).
				for _, m := range e.Messages {
					if e.Batched && !m.HasSequence {
						t.Fatalf("entry %d:%d, built by the proxy, holds a message without a sequence id of its own (the entry's is %d)", e.Ledger, e.Entry, e.SequenceID)
					}
				}
				if pol.Kind == rebatch.Properties {
					if !e.Batched {
						t.Fatalf("entry %d:%d is not in batch format", e.Ledger, e.Entry)
					}
					if got := mapString(e.Properties); got != group {
						t.Fatalf("entry %d:%d outer properties %q, want its group %q", e.Ledger, e.Entry, got, group)
					}
				}
			}
			if next != len(order) {
				t.Fatalf("broker stored %d messages, sent %d", next, len(order))
			}
			if clientBuilt > 0 {
				t.Logf("%s: %d batches mixing groups stored as the client built them (one sequence id per batch)", name, clientBuilt)
			}
			if pol.Kind == rebatch.Coalesce && len(entries)*2 > len(order) {
				t.Fatalf("%d unbatched messages stored in %d entries: coalesce merged less than 2x", len(order), len(entries))
			}

			// What the same client consumes through the proxy.
			got, err := d.Consume(ctx, drivers.ConsumeSpec{URL: url, Topic: topic, Subscription: "check",
				Type: "exclusive", Count: len(order), InitialPosition: "earliest"})
			if err != nil {
				t.Fatalf("consume: %v", err)
			}
			if len(got.Messages) != len(order) {
				t.Fatalf("consumed %d messages, sent %d", len(got.Messages), len(order))
			}
			for k, m := range got.Messages {
				want := order[k]
				if m.I != want.i || m.Props["run"] != want.run || m.Redelivery != 0 {
					t.Fatalf("consumed #%d is %s/%d (redelivery %d), want %s/%d: order or exactly-once broken",
						k, m.Props["run"], m.I, m.Redelivery, want.run, want.i)
				}
				if mapString(m.Props) != mapString(props[want]) {
					t.Fatalf("consumed %v with properties %v, sent %v", want, m.Props, props[want])
				}
				if wantKey := "key-" + strconv.Itoa(want.i%5); m.Key == nil || *m.Key != wantKey {
					t.Fatalf("consumed %v with key %v, sent %q", want, m.Key, wantKey)
				}
			}
			t.Logf("%s: %d messages stored in %d entries, consumed once each in producer order",
				name, len(order), len(entries))
		})
	}
}
