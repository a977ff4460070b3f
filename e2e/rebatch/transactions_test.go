package rebatch_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/rebatchproxy/rebatchproxy/e2e/drivers"
	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
	"github.com/rebatchproxy/rebatchproxy/rebatch"
)

// Transactions are one of the things a rewriting policy never merges or splits (DESIGN.md
// section 2): a send carrying a transaction id goes to the broker alone and unchanged, after the
// open batch, so the broker's transaction buffer holds exactly what the client sent, and what an
// open transaction wrote stays invisible to consumers until it commits.

// Given a broker with transactions enabled and the proxy under a rewriting policy (the first
// subtest on the fresh broker gets transaction (0, 0), whose id is present though zero),
// when an unbatched producer through the proxy sends p-0..p-49, then a-0..a-9 in a transaction
// it leaves open, then p-50..p-99,
// then a consumer receives p-0..p-49 and nothing more while the transaction is open, and, once
// it commits, a-0..a-9 and p-50..p-99 in order (under buckets, which orders by key only and
// these messages have none, in any order), each message once; and the plain sends were merged
// into far fewer entries than sends. Directly, the same (the spec's own baseline).
func TestTransactionsThroughRewritingPolicies(t *testing.T) {
	b, err := harness.StartBroker(harness.Options{ExtraConf: "transactionCoordinatorEnabled=true"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop() })
	for _, pol := range []rebatch.Policy{
		{Kind: rebatch.Coalesce, MaxDelay: 5 * time.Millisecond},
		{Kind: rebatch.Properties, MaxDelay: 5 * time.Millisecond, Restricted: map[string][]string{"region": nil}},
		{Kind: rebatch.Buckets, Buckets: 4, MaxDelay: 5 * time.Millisecond},
		{Kind: rebatch.Passthrough},
		{Kind: "direct"},
	} {
		t.Run(string(pol.Kind), func(t *testing.T) {
			ns := newNamespace(t, b, "txn")
			url := b.ServiceURL
			if pol.Kind != "direct" {
				url = startProxy(t, b, ns, pol)
			}
			topic := "persistent://" + ns + "/t"
			c := newTxnClient(t, url)
			p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic, DisableBatching: true, SendTimeout: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			txn, err := c.NewTransaction(time.Minute)
			if err != nil {
				t.Fatalf("a transaction through the proxy: %v", err)
			}
			t.Logf("transaction %v", txn.GetTxnID())
			sendRun(t, p, "p-", 0, 50, nil)
			sendRun(t, p, "a-", 0, 10, txn)
			sendRun(t, p, "p-", 50, 100, nil)
			cons := subscribeEarliest(t, b, topic)

			before := receiveUntilQuiet(t, cons, 50)
			if err := txn.Commit(ctxT(t, time.Minute)); err != nil {
				t.Fatalf("commit through the proxy: %v", err)
			}
			after := receiveUntilQuiet(t, cons, 60)

			wantBefore, wantAfter := payloads("p-", 0, 50), append(payloads("a-", 0, 10), payloads("p-", 50, 100)...)
			if pol.Kind == rebatch.Buckets {
				// Per-key order only, and these messages have no key: judged as sets.
				for _, s := range [][]string{before, after, wantBefore, wantAfter} {
					sort.Strings(s)
				}
			}
			if err := sameSequence(before, wantBefore); err != nil {
				t.Errorf("while the transaction was open: %v", err)
			}
			if err := sameSequence(after, wantAfter); err != nil {
				t.Errorf("after the commit: %v", err)
			}
			entries, err := b.EntryCount(ctxT(t, 30*time.Second), topic)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("the topic holds %d entries for 110 sends and a commit marker", entries)
			// Directly, 111; the 10 sends of the transaction and the marker stay entries of their
			// own, the 100 plain sends fit in a few dozen.
			if pol.Kind != rebatch.Passthrough && pol.Kind != "direct" && entries > 11+40 {
				t.Fatalf("the topic holds %d entries: the plain sends were not merged", entries)
			}
		})
	}
}

// Given the same broker, and the Java client 4.0.13, which also writes the transaction id into
// each message's metadata (the broker hides an aborted transaction's messages by it; the Go
// client writes it only in CommandSend, so its aborts are not judged above),
// when an unbatched Java producer, through the proxy under each policy and directly, sends
// msg-0..msg-89 (region=eu) asynchronously, msg-30..msg-59 in one transaction, which it aborts (under
// coalesce and directly also one it commits) once every send is acknowledged,
// then a consumer receives msg-0..msg-29 and msg-60..msg-89 in order, and after a commit also
// msg-30..msg-59 in order, each once (under buckets, as sets), and the rewriting policies
// merged the plain sends.
func TestJavaTransactionsThroughRewritingPolicies(t *testing.T) {
	b, err := harness.StartBroker(harness.Options{ExtraConf: "transactionCoordinatorEnabled=true"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Stop() })
	d := preparedDriver(t, "java-4.0.13")
	type txnCase struct {
		pol rebatch.Policy
		end string
	}
	coalesce := rebatch.Policy{Kind: rebatch.Coalesce, MaxDelay: 5 * time.Millisecond}
	var cases []txnCase
	for _, pol := range []rebatch.Policy{
		coalesce,
		{Kind: rebatch.Properties, MaxDelay: 5 * time.Millisecond, Restricted: map[string][]string{"region": nil}},
		{Kind: rebatch.Buckets, Buckets: 4, MaxDelay: 5 * time.Millisecond},
		{Kind: rebatch.Passthrough},
		{Kind: "direct"},
	} {
		cases = append(cases, txnCase{pol, "abort"})
	}
	cases = append(cases, txnCase{coalesce, "commit"}, txnCase{rebatch.Policy{Kind: "direct"}, "commit"})
	for _, tc := range cases {
		t.Run(tc.end+"/"+string(tc.pol.Kind), func(t *testing.T) {
			ns := newNamespace(t, b, "txnjava")
			url := b.ServiceURL
			if tc.pol.Kind != "direct" {
				url = startProxy(t, b, ns, tc.pol)
			}
			topic := "persistent://" + ns + "/t"
			cons := subscribeEarliest(t, b, topic)

			res, err := d.Produce(ctxT(t, 3*time.Minute), drivers.ProduceSpec{URL: url, Topic: topic, Count: 90,
				Batching: drivers.Bool(false), SendTimeout: drivers.Int(0), Txn: tc.end, Properties: "region=eu"})

			if err != nil {
				t.Fatalf("java producer: %v (summary %+v)", err, res.Summary)
			}
			if want := map[string]string{"abort": "aborted", "commit": "committed"}[tc.end]; res.Summary.Txn != want {
				t.Fatalf("the transaction ended %q, want %q (%s)", res.Summary.Txn, want, res.Summary.Error)
			}
			// The client registers the topic with the transaction before it sends the
			// transaction's first message, so msg-60.. may be stored before msg-30..: the two runs
			// are judged apart, each in its own order.
			wantPlain, wantTxn := append(payloads("msg-", 0, 30), payloads("msg-", 60, 90)...), []string(nil)
			if tc.end == "commit" {
				wantTxn = payloads("msg-", 30, 60)
			}
			var plain, inTxn []string
			for _, p := range receiveUntilQuiet(t, cons, len(wantPlain)+len(wantTxn)) {
				if i, _ := strconv.Atoi(strings.TrimPrefix(p, "msg-")); i >= 30 && i < 60 {
					inTxn = append(inTxn, p)
				} else {
					plain = append(plain, p)
				}
			}
			if tc.pol.Kind == rebatch.Buckets {
				for _, s := range [][]string{plain, inTxn, wantPlain, wantTxn} {
					sort.Strings(s)
				}
			}
			if err := sameSequence(plain, wantPlain); err != nil {
				t.Errorf("outside the transaction: %v", err)
			}
			if err := sameSequence(inTxn, wantTxn); err != nil {
				t.Errorf("in the transaction (%sed): %v", tc.end, err)
			}
			entries, err := b.EntryCount(ctxT(t, 30*time.Second), topic)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("the topic holds %d entries for 90 sends and the transaction's marker", entries)
			// Directly, 91; the 30 sends of the transaction and the marker stay entries of their
			// own, and each flushes the batch open before it, so the 60 plain ones merge into
			// fewer the less the two runs interleave (the client registers the transaction first).
			if tc.pol.Kind != rebatch.Passthrough && tc.pol.Kind != "direct" && entries > 31+40 {
				t.Errorf("the topic holds %d entries: the plain sends were not merged", entries)
			}
		})
	}
}

func newTxnClient(t *testing.T, url string) pulsar.Client {
	t.Helper()
	c, err := pulsar.NewClient(pulsar.ClientOptions{URL: url, Logger: quietLogger(), OperationTimeout: 30 * time.Second,
		EnableTransaction: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// sendRun sends prefix+from..prefix+(to-1) asynchronously (in txn, when not nil) and waits for
// every receipt.
func sendRun(t *testing.T, p pulsar.Producer, prefix string, from, to int, txn pulsar.Transaction) {
	t.Helper()
	var msgs []*pulsar.ProducerMessage
	for i := from; i < to; i++ {
		m := &pulsar.ProducerMessage{Payload: []byte(prefix + strconv.Itoa(i)), Properties: map[string]string{"region": "r" + strconv.Itoa(i/25)}}
		if txn != nil {
			m.Transaction = txn
		}
		msgs = append(msgs, m)
	}
	sendAll(t, p, msgs)
}

func payloads(prefix string, from, to int) []string {
	var s []string
	for i := from; i < to; i++ {
		s = append(s, prefix+strconv.Itoa(i))
	}
	return s
}

// subscribeEarliest subscribes to topic directly at the broker, from its first message.
func subscribeEarliest(t *testing.T, b *harness.Broker, topic string) pulsar.Consumer {
	t.Helper()
	c := newClient(t, b.ServiceURL)
	cons, err := c.Subscribe(pulsar.ConsumerOptions{Topic: topic, SubscriptionName: "check", Type: pulsar.Exclusive,
		SubscriptionInitialPosition: pulsar.SubscriptionPositionEarliest})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cons.Close)
	return cons
}

// receiveUntilQuiet reads until n messages arrived (waiting up to a minute) and then no more
// within 3 s, and returns their payloads in the order received.
func receiveUntilQuiet(t *testing.T, cons pulsar.Consumer, n int) []string {
	t.Helper()
	var got []string
	deadline := time.Now().Add(time.Minute)
	for {
		wait := 3 * time.Second
		if len(got) < n {
			wait = time.Until(deadline)
		}
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		m, err := cons.Receive(ctx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) {
			return got
		}
		if err != nil {
			t.Fatalf("receive after %d messages: %v", len(got), err)
		}
		got = append(got, string(m.Payload()))
		_ = cons.Ack(m)
	}
}

// sameSequence says where got differs from want.
func sameSequence(got, want []string) error {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return fmt.Errorf("message %d received is %q, want %q (order, exactly-once or transaction isolation broken)", i, got[i], want[i])
		}
	}
	if len(got) != len(want) {
		return fmt.Errorf("received %d messages, want %d: %v", len(got), len(want), got)
	}
	return nil
}
