package drivers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rebatchproxy/rebatchproxy/route"
)

// These tests run every driver against a real broker, directly (no proxy):
// PULSAR_SERVICE_URL (default pulsar://127.0.0.1:16650) and PULSAR_ADMIN_URL (default
// http://127.0.0.1:18080). A broker that does not answer is a failure, not a skip.

func serviceURL() string { return envOr("PULSAR_SERVICE_URL", "pulsar://127.0.0.1:16650") }
func adminURL() string {
	return strings.TrimRight(envOr("PULSAR_ADMIN_URL", "http://127.0.0.1:18080"), "/")
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

var httpClient = &http.Client{Timeout: 15 * time.Second}

func requireBroker(t *testing.T) {
	t.Helper()
	resp, err := httpClient.Get(adminURL() + "/admin/v2/brokers/health")
	if err != nil {
		t.Fatalf("broker admin %s unreachable (start one with e2e/pulsar/pulsar.sh start): %v", adminURL(), err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || strings.TrimSpace(string(b)) != "ok" {
		t.Fatalf("broker health: %d %q", resp.StatusCode, b)
	}
}

func allDrivers(t *testing.T) []*Driver {
	t.Helper()
	all, err := All()
	if err != nil {
		t.Fatal(err)
	}
	if only := os.Getenv("DRIVERS_ONLY"); only != "" { // e.g. DRIVERS_ONLY=go-v0.8.1,java-4.0.13
		var sel []*Driver
		for _, n := range strings.Split(only, ",") {
			d, err := ByName(strings.TrimSpace(n))
			if err != nil {
				t.Fatal(err)
			}
			sel = append(sel, d)
		}
		return sel
	}
	return all
}

var unsafeChars = regexp.MustCompile(`[^a-zA-Z0-9-]`)

func newTopic(parts ...string) string {
	name := unsafeChars.ReplaceAllString(strings.Join(parts, "-"), "-")
	return "persistent://public/default/drivers-" + name + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
}

// entriesAdded reads the broker's count of entries written to topic (internal stats).
func entriesAdded(t *testing.T, topic string) int64 {
	t.Helper()
	path := strings.TrimPrefix(topic, "persistent://")
	resp, err := httpClient.Get(adminURL() + "/admin/v2/persistent/" + path + "/internalStats")
	if err != nil {
		t.Fatalf("internalStats: %v", err)
	}
	defer resp.Body.Close()
	var st struct {
		EntriesAddedCounter *int64 `json:"entriesAddedCounter"`
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || json.Unmarshal(b, &st) != nil || st.EntriesAddedCounter == nil {
		t.Fatalf("internalStats %s: %d %s", topic, resp.StatusCode, b)
	}
	return *st.EntriesAddedCounter
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

func prepare(t *testing.T, ctx context.Context, d *Driver) {
	t.Helper()
	start := time.Now()
	if err := d.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > time.Second {
		t.Logf("prepared %s in %v (run e2e/drivers/setup.sh beforehand to keep this out of tests)", d.Name, el.Round(time.Millisecond))
	}
}

// TestRoundTrip: 200 keyed messages with properties, batched, then 50 unbatched synchronous ones,
// consumed back by one exclusive consumer of the same client. Checks count, order, payload index,
// key, properties and payload size of every message, that producer and consumer agree on where
// each message is stored, and, from the broker's own stats, that batching really was on and off.
func TestRoundTrip(t *testing.T) {
	requireBroker(t)
	for _, d := range allDrivers(t) {
		t.Run(d.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			prepare(t, ctx, d)
			topic := newTopic("rt", d.Name)
			const nBatched, nSingle, keys, size = 200, 50, 7, 64

			batched, err := d.Produce(ctx, ProduceSpec{URL: serviceURL(), Topic: topic, Count: nBatched,
				Batching: Bool(true), BatchMaxMessages: 50, BatchDelay: Int(20), KeyMode: "seq", Keys: keys,
				Properties: "run=batched,group={i%3},n={i}", Size: size})
			if err != nil {
				t.Fatalf("batched produce: %v", err)
			}
			checkAcks(t, "batched", batched, nBatched, keys, false)
			e1 := entriesAdded(t, topic)
			if e1 < 1 || e1 >= nBatched {
				t.Errorf("batched produce wrote %d entries for %d messages: batching was not on", e1, nBatched)
			}

			single, err := d.Produce(ctx, ProduceSpec{URL: serviceURL(), Topic: topic, Count: nSingle,
				Batching: Bool(false), Sync: true, KeyMode: "seq", Keys: keys,
				Properties: "run=single,group={i%3},n={i}", Size: size})
			if err != nil {
				t.Fatalf("unbatched produce: %v", err)
			}
			checkAcks(t, "single", single, nSingle, keys, true)
			if e2 := entriesAdded(t, topic) - e1; e2 != nSingle {
				t.Errorf("unbatched produce wrote %d entries for %d messages", e2, nSingle)
			}
			t.Logf("entries: %d for %d batched messages, %d for %d unbatched", e1, nBatched, entriesAdded(t, topic)-e1, nSingle)

			got, err := d.Consume(ctx, ConsumeSpec{URL: serviceURL(), Topic: topic, Subscription: "rt",
				Type: "exclusive", Count: nBatched + nSingle, InitialPosition: "earliest", Timeout: time.Minute})
			if err != nil {
				t.Fatalf("consume: %v", err)
			}
			if len(got.Messages) != nBatched+nSingle {
				t.Fatalf("consumed %d messages, want %d", len(got.Messages), nBatched+nSingle)
			}
			where := map[string]string{} // run/i -> ledger:entry from the producer's acks
			for _, a := range batched.Acks {
				where[fmt.Sprintf("batched/%d", a.I)] = a.MsgID.LedgerEntry()
			}
			for _, a := range single.Acks {
				where[fmt.Sprintf("single/%d", a.I)] = a.MsgID.LedgerEntry()
			}
			for n, m := range got.Messages {
				run, want := "batched", n
				if n >= nBatched {
					run, want = "single", n-nBatched
				}
				ctxt := fmt.Sprintf("message #%d (%s %s)", n, m.MsgID, run)
				if m.I != want {
					t.Fatalf("%s: payload index %d, want %d (order broken)", ctxt, m.I, want)
				}
				if wk := fmt.Sprintf("key-%d", want%keys); deref(m.Key) != wk {
					t.Errorf("%s: key %s, want %s", ctxt, deref(m.Key), wk)
				}
				wp := map[string]string{"run": run, "group": strconv.Itoa(want % 3), "n": strconv.Itoa(want)}
				if fmt.Sprint(m.Props) != fmt.Sprint(wp) {
					t.Errorf("%s: properties %v, want %v", ctxt, m.Props, wp)
				}
				if m.PayloadLen != size || m.DecodeError != "" || m.Nacked || m.Redelivery != 0 {
					t.Errorf("%s: payload_len %d decode_error %q nacked %v redelivery %d", ctxt,
						m.PayloadLen, m.DecodeError, m.Nacked, m.Redelivery)
				}
				if le := where[fmt.Sprintf("%s/%d", run, want)]; le != m.MsgID.LedgerEntry() {
					t.Errorf("%s: consumer says entry %s, producer said %s", ctxt, m.MsgID.LedgerEntry(), le)
				}
				if d.Supports(FeatureObserveSeq) && m.Seq == nil {
					t.Errorf("%s: %s should report the sequence id", ctxt, d.Name)
				}
			}
			if got.Summary.Acked != nBatched+nSingle || got.Summary.Received != nBatched+nSingle {
				t.Errorf("consume summary %+v", got.Summary)
			}
			t.Logf("wall time: produce %v + %v, consume %v", batched.Elapsed.Round(time.Millisecond),
				single.Elapsed.Round(time.Millisecond), got.Elapsed.Round(time.Millisecond))
		})
	}
}

func checkAcks(t *testing.T, what string, r *ProduceResult, n, keys int, sync bool) {
	t.Helper()
	if len(r.Acks) != n || len(r.Errors) != 0 || r.Summary.Acked != n || r.Summary.Failed != 0 {
		t.Fatalf("%s: %d acks, %d errors, summary %+v", what, len(r.Acks), len(r.Errors), r.Summary)
	}
	seen := make([]bool, n)
	var lastSeq int64 = -1
	for _, a := range r.Acks {
		if a.I < 0 || a.I >= n || seen[a.I] {
			t.Fatalf("%s: ack for index %d twice or out of range", what, a.I)
		}
		seen[a.I] = true
		if wk := fmt.Sprintf("key-%d", a.I%keys); deref(a.Key) != wk {
			t.Errorf("%s: ack %d key %s, want %s", what, a.I, deref(a.Key), wk)
		}
		if a.MsgID.Ledger < 0 || a.MsgID.Entry < 0 {
			t.Errorf("%s: ack %d has message id %s", what, a.I, a.MsgID)
		}
		if sync {
			if a.Seq == nil || *a.Seq <= lastSeq {
				t.Errorf("%s: sync ack %d sequence id %v after %d", what, a.I, a.Seq, lastSeq)
			} else {
				lastSeq = *a.Seq
			}
		}
	}
}

// TestUnsupportedFeatures checks that every feature a driver is listed as lacking is refused with
// exit code 3 and an unsupported line naming it; the drivers validate before connecting, so this
// needs no broker. The converse (a listed feature works) is checked by the tests that use it:
// chunking and chunk size (TestChunking), sticky ranges and ordering keys (TestKeySharedSticky),
// snappy (TestNackWithJSONSchema).
func TestUnsupportedFeatures(t *testing.T) {
	const nowhere = "pulsar://127.0.0.1:1" // closed port: a request that passed validation fails (exit 1)
	produceFor := map[Feature]ProduceSpec{
		FeatureChunking:    {Chunking: true},
		FeatureChunkSize:   {Chunking: true, ChunkSize: 1000},
		FeatureSnappy:      {Compression: "snappy"},
		FeatureOrderingKey: {KeyMode: "fixed", OrderingKey: true},
		FeatureSchema:      {Schema: "json"},
		FeatureTLSAuth:     {TLSCertFile: "client.pem", TLSKeyFile: "client.key"},
		FeatureHTTPLookup:  {URL: "http://127.0.0.1:1"},
	}
	consumeFor := map[Feature]ConsumeSpec{
		FeatureStickyRanges: {Type: "key_shared", StickyRanges: "0-100"},
		FeatureNack:         {NackFirst: 1},
	}
	for _, d := range allDrivers(t) {
		t.Run(d.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			prepare(t, ctx, d)
			check := func(f Feature, err error) {
				t.Helper()
				var u *UnsupportedError
				if !errors.As(err, &u) {
					t.Errorf("%s is listed as unsupported but the driver did not refuse it: %v", f, err)
				} else if u.Feature != string(f) && !(f == FeatureChunkSize && u.Feature == string(FeatureChunking)) {
					t.Errorf("refused %q, want %q", u.Feature, f)
				}
			}
			for f := range d.Unsupported() {
				if spec, ok := produceFor[f]; ok {
					if spec.URL == "" {
						spec.URL = nowhere
					}
					spec.Topic, spec.Count, spec.Timeout = "persistent://public/default/x", 1, time.Second
					_, err := d.Produce(ctx, spec)
					check(f, err)
				}
				if spec, ok := consumeFor[f]; ok {
					spec.URL, spec.Topic, spec.Subscription, spec.Timeout = nowhere, "persistent://public/default/x", "s", time.Second
					_, err := d.Consume(ctx, spec)
					check(f, err)
				}
			}
		})
	}
}

// TestKeySharedSticky: two Key_Shared STICKY consumers of the same client own the two halves of
// the hash ring; every message must reach the consumer whose range holds its key's slot
// (route.StickySlot, the broker's), in per-key order. Messages are unbatched so that each entry has one key.
func TestKeySharedSticky(t *testing.T) {
	requireBroker(t)
	const n, keys = 60, 12
	ranges := [2]string{"0-32767", "32768-65535"}
	owner := func(key string) int {
		if route.StickySlot([]byte(key)) > 32767 {
			return 1
		}
		return 0
	}
	var want [2]int
	for i := 0; i < n; i++ {
		want[owner(fmt.Sprintf("key-%d", i%keys))]++
	}
	if want[0] == 0 || want[1] == 0 {
		t.Fatalf("keys all hash to one half: %v", want)
	}
	for _, d := range allDrivers(t) {
		if !d.Supports(FeatureStickyRanges) {
			t.Logf("%s: no Key_Shared STICKY ranges (%s)", d.Name, d.Unsupported()[FeatureStickyRanges])
			continue
		}
		t.Run(d.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			prepare(t, ctx, d)
			topic := newTopic("ks", d.Name)
			var runs [2]*ConsumeRun
			for c := range runs {
				r, err := d.StartConsume(ctx, ConsumeSpec{URL: serviceURL(), Topic: topic, Subscription: "ks",
					Type: "key_shared", StickyRanges: ranges[c], Count: want[c], ConsumerName: fmt.Sprintf("c%d", c),
					InitialPosition: "earliest", Timeout: time.Minute})
				if err != nil {
					t.Fatalf("consumer %d: %v", c, err)
				}
				defer r.Stop()
				runs[c] = r
			}
			// Ordering keys (equal to the keys) where the client can set them: the broker then hashes
			// the ordering key, and the consumer must report it.
			withOK := d.Supports(FeatureOrderingKey)
			if _, err := d.Produce(ctx, ProduceSpec{URL: serviceURL(), Topic: topic, Count: n,
				Batching: Bool(false), KeyMode: "seq", Keys: keys, OrderingKey: withOK}); err != nil {
				t.Fatalf("produce: %v", err)
			}
			seen := make([]int, n)
			for c, r := range runs {
				res, err := r.Wait()
				if err != nil {
					t.Fatalf("consumer %d (%s): %v", c, ranges[c], err)
				}
				last := map[string]int{}
				for _, m := range res.Messages {
					k := deref(m.Key)
					switch {
					case withOK && d.HasQuirk(QuirkDropsUnbatchedOrderingKey):
						if m.OrderingKey != nil {
							t.Errorf("consumer %d: message %d has ordering key %s: quirk %s gone?", c, m.I,
								*m.OrderingKey, QuirkDropsUnbatchedOrderingKey)
						}
					case withOK && m.OrderingKeyKnown && deref(m.OrderingKey) != k:
						t.Errorf("consumer %d: message %d ordering key %s, want %s", c, m.I, deref(m.OrderingKey), k)
					case !withOK && m.OrderingKey != nil:
						t.Errorf("consumer %d: message %d has ordering key %s, none was set", c, m.I, *m.OrderingKey)
					}
					if owner(k) != c {
						t.Errorf("consumer %d (%s) got key %s (slot %d)", c, ranges[c], k, route.StickySlot([]byte(k)))
					}
					if p, ok := last[k]; ok && m.I <= p {
						t.Errorf("consumer %d: key %s index %d after %d", c, k, m.I, p)
					}
					last[k] = m.I
					if m.I >= 0 && m.I < n {
						seen[m.I]++
					}
				}
			}
			for i, s := range seen {
				if s != 1 {
					t.Errorf("message %d delivered %d times", i, s)
				}
			}
		})
	}
}

// maxMessageSize reads the broker's maxMessageSize (runtime configuration), default 5 MiB.
func maxMessageSize(t *testing.T) int {
	t.Helper()
	resp, err := httpClient.Get(adminURL() + "/admin/v2/brokers/configuration/runtime")
	if err != nil {
		t.Fatalf("runtime configuration: %v", err)
	}
	defer resp.Body.Close()
	var conf map[string]string
	if err := json.NewDecoder(resp.Body).Decode(&conf); err != nil {
		t.Fatalf("runtime configuration: %v", err)
	}
	if v, err := strconv.Atoi(conf["maxMessageSize"]); err == nil && v > 0 {
		return v
	}
	return 5 << 20
}

// TestChunking: chunked messages round-trip, and the broker stored more entries than messages.
// Drivers with a chunk size send 25000-byte messages in 10000-byte chunks; the others send one
// message a little above the broker's max message size.
func TestChunking(t *testing.T) {
	requireBroker(t)
	maxSize := maxMessageSize(t)
	for _, d := range allDrivers(t) {
		if !d.Supports(FeatureChunking) {
			t.Logf("%s: no chunking (%s)", d.Name, d.Unsupported()[FeatureChunking])
			continue
		}
		t.Run(d.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			prepare(t, ctx, d)
			topic := newTopic("chunk", d.Name)
			spec := ProduceSpec{URL: serviceURL(), Topic: topic, Chunking: true, KeyMode: "seq", Keys: 2}
			if d.Supports(FeatureChunkSize) {
				spec.Count, spec.Size, spec.ChunkSize = 3, 25000, 10000
			} else {
				spec.Count, spec.Size = 1, maxSize+maxSize/10
			}
			if _, err := d.Produce(ctx, spec); err != nil {
				t.Fatalf("produce: %v", err)
			}
			if e := entriesAdded(t, topic); e <= int64(spec.Count) {
				t.Errorf("%d chunked messages of %d bytes took %d entries: not chunked", spec.Count, spec.Size, e)
			} else {
				t.Logf("%d messages of %d bytes -> %d entries", spec.Count, spec.Size, e)
			}
			got, err := d.Consume(ctx, ConsumeSpec{URL: serviceURL(), Topic: topic, Subscription: "c",
				Count: spec.Count, Timeout: time.Minute})
			if err != nil {
				t.Fatalf("consume: %v", err)
			}
			for n, m := range got.Messages {
				if m.I != n || m.PayloadLen != spec.Size || deref(m.Key) != fmt.Sprintf("key-%d", n%2) {
					t.Errorf("message #%d: index %d, %d bytes, key %s", n, m.I, m.PayloadLen, deref(m.Key))
				}
			}
		})
	}
}

// TestNackWithJSONSchema: ten compressed JSON-schema messages (snappy where the client has it,
// else zstd); the consumer negative-acks the first three and must get them again, acknowledging
// each index exactly once.
func TestNackWithJSONSchema(t *testing.T) {
	requireBroker(t)
	const n, nack = 10, 3
	for _, d := range allDrivers(t) {
		if !d.Supports(FeatureSchema) || !d.Supports(FeatureNack) {
			continue // its refusal is TestUnsupportedFeatures' to check
		}
		t.Run(d.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			prepare(t, ctx, d)
			topic := newTopic("nack", d.Name)
			codec := "zstd"
			if d.Supports(FeatureSnappy) {
				codec = "snappy"
			}
			if _, err := d.Produce(ctx, ProduceSpec{URL: serviceURL(), Topic: topic, Count: n, Schema: "json",
				Size: 30, Compression: codec}); err != nil {
				t.Fatalf("produce: %v", err)
			}
			got, err := d.Consume(ctx, ConsumeSpec{URL: serviceURL(), Topic: topic, Subscription: "n", Schema: "json",
				Count: n, NackFirst: nack, NackDelay: 200 * time.Millisecond, Timeout: time.Minute})
			if err != nil {
				t.Fatalf("consume: %v", err)
			}
			acked := make([]int, n)
			var nacked []int
			for _, m := range got.Messages {
				if m.DecodeError != "" || m.I < 0 || m.I >= n {
					t.Fatalf("bad message %+v", m)
				}
				if m.Nacked {
					nacked = append(nacked, m.I)
				} else {
					acked[m.I]++
				}
			}
			if fmt.Sprint(nacked) != "[0 1 2]" {
				t.Errorf("negative-acked %v, want [0 1 2]", nacked)
			}
			for i, a := range acked {
				if a != 1 {
					t.Errorf("index %d acknowledged %d times", i, a)
				}
			}
			if got.Summary.Received != n+nack || got.Summary.Nacked != nack {
				t.Errorf("summary %+v", got.Summary)
			}
		})
	}
}

// TestSchemaInterop: the drivers' JSON and Avro schemas are the same schema to the broker, so one
// client's records are readable by the others on the same topic.
func TestSchemaInterop(t *testing.T) {
	requireBroker(t)
	cases := []struct {
		schema, producer string
		consumers        []string
	}{
		{"avro", "java-4.0.13", []string{"go-v0.21.0", "go-v0.8.1", "python-3.13.0"}},
		{"avro", "go-v0.21.0", []string{"java-2.10.6", "python-3.1.0"}},
		{"json", "go-v0.8.1", []string{"java-3.0.7", "python-3.1.0", "go-v0.21.0"}},
	}
	for _, c := range cases {
		t.Run(c.schema+"-from-"+c.producer, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			p, err := ByName(c.producer)
			if err != nil {
				t.Fatal(err)
			}
			prepare(t, ctx, p)
			topic := newTopic("schema", c.schema, c.producer)
			if _, err := p.Produce(ctx, ProduceSpec{URL: serviceURL(), Topic: topic, Count: 5, Schema: c.schema}); err != nil {
				t.Fatalf("produce: %v", err)
			}
			for _, name := range c.consumers {
				d, err := ByName(name)
				if err != nil {
					t.Fatal(err)
				}
				prepare(t, ctx, d)
				got, err := d.Consume(ctx, ConsumeSpec{URL: serviceURL(), Topic: topic, Subscription: "s-" + name,
					Schema: c.schema, Count: 5, Timeout: time.Minute})
				if err != nil {
					t.Errorf("%s: %v", name, err)
					continue
				}
				for n, m := range got.Messages {
					if m.I != n || m.DecodeError != "" {
						t.Errorf("%s: message #%d: index %d, decode error %q", name, n, m.I, m.DecodeError)
					}
				}
			}
		})
	}
}
