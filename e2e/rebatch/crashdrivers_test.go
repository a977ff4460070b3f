package rebatch_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/rebatchproxy/rebatchproxy/e2e/drivers"
	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
)

// Given broker de-duplication on and a key-based batching producer of a released client (Java
// 2.10.6 and 4.0.13, Python 3.13.0) sending 20,000 messages over 50 keys asynchronously with no
// send timeout (region = i mod 5, one property group per key), through the proxy run as a
// separate process under passthrough, coalesce, properties or buckets,
// when the proxy is killed with SIGKILL once the broker has taken 3,000 messages, and started
// again on the same port a second later,
// then the client reconnects and resends, every send is acknowledged, the broker stores every
// message exactly once, and entries hold one property group (properties) or bucket (buckets).
func TestKill9ProxyMidStreamWithKeyBasedClients(t *testing.T) {
	b := harness.Default(t)
	const n = 20000
	var mu sync.Mutex
	var table []string
	t.Cleanup(func() {
		t.Logf("kill -9 of the proxy mid-stream, key-based batchers, de-duplication on, %d messages each:\n%-14s %s\n%s",
			n, "client", storedHeader, strings.Join(table, "\n"))
	})
	for _, name := range []string{"java-2.10.6", "java-4.0.13", "python-3.13.0"} {
		t.Run(name, func(t *testing.T) {
			d := preparedDriver(t, name)
			for _, path := range []string{"passthrough", "coalesce", "properties", "buckets"} {
				c := faultDuringDriverRun(t, b, d, path, n, killProxy)
				mu.Lock()
				table = append(table, fmt.Sprintf("%-14s %s", name, c))
				mu.Unlock()
				if c.acked != n || c.failed != 0 || c.lost != 0 || c.dups != 0 || !c.policyKept() {
					t.Errorf("%s: not exactly once, or not as the policy promises, after kill -9:\n%s\n%s", path, storedHeader, c)
				}
			}
		})
	}
}

// Given a private broker with de-duplication on and a key-based batching producer of a released
// client (Java 2.10.6 and 4.0.13, Python 3.13.0) sending 20,000 messages over 50 keys
// asynchronously with no send timeout, through the proxy run as a separate process under a
// rewriting policy (coalesce, buckets, properties: one client each),
// when the broker is killed with SIGKILL once it has taken 3,000 messages, and recovered on its
// data (the proxy answers the clients' reconnections with ServiceNotReady meanwhile),
// then the client reconnects and resends, every send is acknowledged, the broker stores every
// message exactly once, and entries hold one property group (properties) or bucket (buckets).
// TestKill9BrokerMidStreamStoresEveryMessageOnce does the same with pulsar-client-go; these
// clients number and resend their batches their own way.
func TestKill9BrokerMidStreamWithReleasedClients(t *testing.T) {
	b, err := harness.StartBroker(harness.Options{Dedup: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop() })
	const n = 20000
	var table []string
	t.Cleanup(func() {
		t.Logf("kill -9 of the broker mid-stream and its recovery, key-based batchers, de-duplication on, %d messages each:\n%-14s %s\n%s",
			n, "client", storedHeader, strings.Join(table, "\n"))
	})
	for _, c := range []struct{ client, path string }{
		{"java-2.10.6", "coalesce"}, {"java-4.0.13", "buckets"}, {"python-3.13.0", "properties"},
	} {
		t.Run(c.client+"/"+c.path, func(t *testing.T) {
			d := preparedDriver(t, c.client)
			r := faultDuringDriverRun(t, b, d, c.path, n, killBroker(b))
			table = append(table, fmt.Sprintf("%-14s %s", c.client, r))
			if r.acked != n || r.failed != 0 || r.lost != 0 || r.dups != 0 || !r.policyKept() {
				t.Errorf("not exactly once, or not as the policy promises, after kill -9 of the broker:\n%s\n%s", storedHeader, r)
			}
		})
	}
}

// driverFault breaks a driver case's path mid-stream (kills the proxy pp or the broker) and
// mends it. Which goroutine: the case's test goroutine.
type driverFault func(t *testing.T, path string, pp *harness.ProcessProxy)

// killProxy kills the case's proxy with SIGKILL and starts it again on the same port a second
// later.
func killProxy(t *testing.T, path string, pp *harness.ProcessProxy) {
	pp.Kill9()
	time.Sleep(time.Second)
	if fails := pp.StartRetrying(90 * time.Second); fails > 0 {
		t.Logf("%s: restart: %d attempts failed with \"address already in use\"", path, fails)
	}
}

// killBroker kills broker b (one StartBroker started) with SIGKILL and recovers it on its data.
func killBroker(b *harness.Broker) driverFault {
	return func(t *testing.T, path string, _ *harness.ProcessProxy) {
		at := time.Now()
		if err := b.Kill9(); err != nil {
			t.Fatalf("%s: kill -9 of the broker: %v", path, err)
		}
		if err := b.Recover(); err != nil {
			t.Fatalf("%s: recovering the broker: %v", path, err)
		}
		t.Logf("%s: broker down %.1f s", path, time.Since(at).Seconds())
	}
}

// faultDuringDriverRun runs one case of the driver crash specs: the producer runs through its
// own proxy process, and fault strikes once the broker has taken 3,000 messages.
func faultDuringDriverRun(t *testing.T, b *harness.Broker, d *drivers.Driver, path string, n int, fault driverFault) storedCount {
	t.Helper()
	ns := newNamespace(t, b, "crash-"+path)
	if err := b.SetNamespaceDeduplication(ctxT(t, 30*time.Second), ns, true); err != nil {
		t.Fatal(err)
	}
	topic := "persistent://" + ns + "/t"
	// A durable subscription keeps every ledger: without one (and without retention) the broker
	// deletes the ledger a broker crash closes as soon as it is back, and the count below would
	// miss its messages (a CI run lost exactly the 3,000 taken before the kill so).
	keep, err := newClient(t, b.ServiceURL).Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "keep",
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
	if err != nil {
		t.Fatal(err)
	}
	keep.Close()
	pp := harness.StartProcessProxy(t, b, "policies:\n"+crashRule(ns, path, "'0', '1', '2'"))
	spec := drivers.ProduceSpec{URL: pp.URL(), Topic: topic, Count: n, Batcher: "key-based", KeyMode: "seq", Keys: 50,
		Properties: "i={i},region={i%5}", BatchDelay: drivers.Int(10), SendTimeout: drivers.Int(0),
		ProducerName: "crash-" + path, Timeout: 4 * time.Minute}
	type result struct {
		res *drivers.ProduceResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := d.Produce(context.Background(), spec)
		done <- result{res, err}
	}()
	// The fault: once the broker has taken 3,000 messages, with many more to come.
	ctx := ctxT(t, 2*time.Minute)
	var in int64
	for in < 3000 {
		select {
		case r := <-done:
			t.Fatalf("%s: the producer finished before the fault (broker took %d): %v", path, in, r.err)
		case <-ctx.Done():
			t.Fatalf("%s: the broker took only %d messages before the deadline", path, in)
		case <-time.After(20 * time.Millisecond):
		}
		in, _ = b.MessagesIn(ctx, topic)
	}
	fault(t, path, pp)
	r := <-done
	if r.err != nil {
		t.Fatalf("%s: produce after the fault: %v", path, r.err)
	}
	group := func(i int) string {
		if v := i % 5; v < 3 {
			return "region=" + strconv.Itoa(v)
		}
		return ""
	}
	c, _ := countStored(t, b, topic, n, path, group)
	c.acked, c.failed, c.received = r.res.Summary.Acked, r.res.Summary.Failed, -1
	c.asBuilt = fmt.Sprintf("fault at %d in", in)
	t.Logf("%s\n%s", storedHeader, c)
	return c
}
