package rebatch

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rebatchproxy/rebatchproxy/route"
	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

func TestNumberingOfTheReleasedBatchers(t *testing.T) {
	ids := func(seqs ...uint64) []msgRef {
		var out []msgRef
		for _, s := range seqs {
			out = append(out, msgRef{seq: s})
		}
		return out
	}
	for _, tc := range []struct {
		name          string
		seq, highest  uint64
		msgs          []msgRef
		atomic, mixed bool
		want          numbering
	}{
		{"Go default: first id, no highest", 10, 0, ids(10, 11, 12), false, false, numbering{true, 10, 12}},
		{"Java default: first and last", 10, 12, ids(10, 11, 12), false, false, numbering{true, 10, 12}},
		{"C++ 3.4-4.0: last id", 12, 0, ids(10, 11, 12), false, false, numbering{true, 10, 12}},
		{"one message", 7, 0, ids(7), false, false, numbering{true, 7, 7}},
		{"Go key-based: first of interleaved ids", 0, 0, ids(0, 10, 20), false, false, numbering{false, 0, 0}},
		{"Java key-based: highest of interleaved ids", 20, 20, ids(0, 10, 20), false, false, numbering{false, 20, 20}},
		{"Java key-based, a consecutive run", 12, 12, ids(10, 11, 12), false, false, numbering{true, 10, 12}},
		{"application ids out of order", 5, 9, ids(5, 3, 9), false, false, numbering{false, 5, 9}},
		{"application ids, highest below the first", 9, 3, ids(9, 5, 3), false, false, numbering{false, 9, 9}},
		{"consecutive, but the command names neither end", 11, 0, ids(10, 11, 12), false, false, numbering{false, 11, 11}},
		{"Go before v0.10: one id per batch", 4, 0, ids(4, 4, 4), true, false, numbering{false, 4, 4}},
		{"some messages without ids", 4, 0, ids(4, 5, 4), false, true, numbering{false, 4, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := numberingOf(tc.seq, tc.highest, tc.msgs, tc.atomic, tc.mixed); got != tc.want {
				t.Fatalf("numberingOf = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// keyedBatch encodes one key batch of a key-based batcher: messages with the given ids, the
// command numbered seq (and highest, when non-zero).
func keyedBatch(t *testing.T, seq, highest uint64, key string, region string, msgIDs ...uint64) []byte {
	t.Helper()
	var msgs []modelMsg
	for _, id := range msgIDs {
		msgs = append(msgs, modelMsg{body: fmt.Sprint(id), key: key, region: region, seq: id})
	}
	return buildSend(t, seq, highest, msgs, true, false).frame
}

// Given the coalesce policy merging across keys and broker de-duplication,
// when a key-based batcher (pulsar-client-go, the C++ and Python clients) sends 200 messages
// over 10 keys as one SEND per key, each numbered by its key's first id (k0 carries 0, 10, ...,
// 190), and the broker acknowledges every entry,
// then every entry the engine builds is numbered within the ids its sends carry on the command,
// so the broker stores all 200 messages, each once.
func TestKeyBasedBatchesAreNumberedByTheirCommandIds(t *testing.T) {
	p := newEngine(t, Policy{Kind: Coalesce, SplitKeys: mixKeys}, -1)
	broker := newBrokerModel()
	var out Output
	for k := uint64(0); k < 10; k++ {
		var ids []uint64
		for i := k; i < 200; i += 10 {
			ids = append(ids, i)
		}
		send(t, p, keyedBatch(t, k, 0, fmt.Sprint("k", k), "us", ids...), &out)
	}
	if err := p.Flush(&out); err != nil {
		t.Fatal(err)
	}
	var cout Output
	for _, f := range frames(t, out.Broker) {
		s, _ := wire.ParseSend(f)
		ledger, entry := broker.judge(t, "p", f)
		if err := p.Receipt(wire.SendReceipt{ProducerID: pid, SequenceID: s.SequenceID, HasMessageID: true, LedgerID: ledger, EntryID: entry}, &cout); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(decodeClient(t, cout.Client)); got != 10 {
		t.Fatalf("%d receipts, want 10", got)
	}
	for i := 0; i < 200; i++ {
		if n := broker.stored[fmt.Sprint(i)]; n != 1 {
			t.Fatalf("message %d stored %d times", i, n)
		}
	}
	if got := len(frames(t, out.Broker)); got != 1 {
		t.Fatalf("%d entries, want the 10 sends merged into 1", got)
	}
}

// Given the coalesce policy merging across keys,
// when Java's key-based batcher sends two key batches, each numbered by its largest id
// (sequence_id = highest_sequence_id),
// then they are merged whole into one entry numbered from the first command's id to the last's,
// and every message keeps its own id.
func TestJavaKeyBatchesAreMergedWholeUnderTheirCommandIds(t *testing.T) {
	p := newEngine(t, Policy{Kind: Coalesce, SplitKeys: mixKeys}, -1)
	var out Output
	send(t, p, keyedBatch(t, 4, 4, "a", "us", 0, 3, 4), &out)
	send(t, p, keyedBatch(t, 5, 5, "b", "us", 1, 2, 5), &out)
	if err := p.Flush(&out); err != nil {
		t.Fatal(err)
	}
	es := decodeEntries(t, out.Broker)
	if len(es) != 1 || es[0].send.SequenceID != 4 || es[0].send.HighestSequenceID != 5 {
		t.Fatalf("entries %+v", es)
	}
	var got []uint64
	for _, m := range es[0].msgs {
		got = append(got, m.SequenceID)
	}
	if fmt.Sprint(got) != "[0 3 4 1 2 5]" {
		t.Fatalf("message ids %v", got)
	}
}

// Given the properties policy (region: us, eu),
// when a key batch numbered as one id (its command's) holds messages of two groups,
// then it is forwarded as the client built it, since two entries would need two ids, and the
// engine counts it.
func TestSendNeedingMorePiecesThanIdsGoesAsBuilt(t *testing.T) {
	p := newEngine(t, Policy{Kind: Properties, Restricted: map[string][]string{"region": {"us", "eu"}}}, -1)
	b := buildSend(t, 3, 0, []modelMsg{{body: "a", key: "k", region: "us", seq: 3}, {body: "b", key: "k", region: "eu", seq: 13}}, true, false).frame
	var out Output
	send(t, p, b, &out)
	if !bytes.Equal(out.Broker, b) {
		t.Fatal("the send was rewritten")
	}
	if p.Stats().SendsUnsplittable != 1 {
		t.Fatalf("stats %+v", p.Stats())
	}
}

// Given the properties policy (region: us, eu),
// when a batch with application-supplied ids out of order (10, 14, 12, 11, 13; the command
// says 10..13 as Java's batcher does, first and last) alternates groups us, eu, us,
// then it is cut into three entries numbered 10, 11 and 12..13: within the ids the broker
// records for the send directly, rising, the last piece reaching the command's highest.
func TestSpanIsCutIntoPiecesNumberedWithinIt(t *testing.T) {
	p := newEngine(t, Policy{Kind: Properties, Restricted: map[string][]string{"region": {"us", "eu"}}}, -1)
	msgs := []modelMsg{{body: "a", region: "us", seq: 10}, {body: "b", region: "eu", seq: 14}, {body: "c", region: "eu", seq: 12},
		{body: "d", region: "us", seq: 11}, {body: "e", region: "us", seq: 13}}
	var out Output
	send(t, p, buildSend(t, 10, 13, msgs, true, false).frame, &out)
	if err := p.Flush(&out); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range decodeEntries(t, out.Broker) {
		got = append(got, fmt.Sprintf("%d..%d:%s", e.send.SequenceID, e.send.HighestSequenceID, strings.Join(e.bodies, "")))
	}
	if want := "[10..10:a 11..11:bc 12..13:de]"; fmt.Sprint(got) != want {
		t.Fatalf("entries %v, want %s", got, want)
	}
}

// Given an engine whose entry of ids 19..20 the broker has stored,
// when a send numbered 5 arrives (application ids below an earlier batch's, which a direct
// broker drops as duplicates),
// then it is forwarded at once as the client built it, for the broker to judge against that mark.
func TestSendBelowWhatTheBrokerStoredGoesToTheBroker(t *testing.T) {
	p := newEngine(t, Policy{Kind: Coalesce}, -1)
	var out Output
	send(t, p, clientBatch(t, []msg{{payload: "a", seq: 19}, {payload: "b", seq: 20}}, pulsarpb.CompressionType_NONE, nil), &out)
	receiptFor(t, p, 19, 3, 1)
	out.Broker = out.Broker[:0]
	late := clientBatch(t, []msg{{payload: "c", seq: 5}}, pulsarpb.CompressionType_NONE, nil)
	send(t, p, late, &out)
	fs := frames(t, out.Broker)
	if len(fs) != 1 || !bytes.Equal(fs[0].Bytes(), late) || p.Stats().SendsOutOfOrder != 1 || p.Stats().SendsHeldForMark != 0 {
		t.Fatalf("%d frames, stats %+v", len(fs), p.Stats())
	}
}

// Given an engine with its entry of ids 19..20 in flight and a send numbered 5 after it (the
// broker would answer "cannot determine whether the message is a duplicate": 5 lies between
// what it stored and what it was sent, and every released client reconnects on that error),
// when the broker's receipt for the entry 19..20 arrives,
// then the send numbered 5, held until now, is forwarded as the client built it, so the broker
// judges it against a stored mark, as it would have directly.
func TestSendBelowAnEntryInFlightWaitsForItsReceipt(t *testing.T) {
	p, late, out := engineWithHeldSend(t)
	if fs := frames(t, out.Broker); len(fs) != 1 || p.Stats().SendsHeldForMark != 1 {
		t.Fatalf("%d frames before the receipt, stats %+v", len(fs), p.Stats())
	}
	rout := receiptFor19(t, p)
	fs := frames(t, rout.Broker)
	if len(fs) != 1 || !bytes.Equal(fs[0].Bytes(), late) {
		t.Fatalf("%d frames after the receipt", len(fs))
	}
}

// Given the buckets policy, one bucket producer with mark 50, and a send numbered 31 placed in
// the other bucket,
// when a send numbered 5 arrives,
// then it goes unchanged, re-addressed to the bucket producer with the highest mark (50), so
// the broker compares it with the mark a direct connection would have.
func TestBucketsSendBelowWhatTheEngineSentGoesToTheHighestLane(t *testing.T) {
	ring, _ := route.NewEqualBuckets(2)
	keyed := ring.Bucket(route.HashB([]byte("x")))
	marks := []int64{50, 50}
	marks[keyed] = -1
	p, lanes := openBuckets(t, 2, marks)
	var out Output
	send(t, p, clientBatch(t, []msg{{key: "x", payload: "a", seq: 31}}, pulsarpb.CompressionType_NONE, nil), &out)
	out.Broker = out.Broker[:0]
	late := clientBatch(t, []msg{{key: "x", payload: "c", seq: 5}}, pulsarpb.CompressionType_NONE, nil)
	send(t, p, late, &out)
	es := decodeEntries(t, out.Broker)
	f := frame(t, late)
	if len(es) != 1 || es[0].send.ProducerID != lanes[1-keyed] || es[0].send.SequenceID != 5 ||
		!bytes.HasSuffix(es[0].raw, f.Payload()) || p.Stats().SendsOutOfOrder != 1 {
		t.Fatalf("entries %+v (lanes %v, bucket of the key %d)", es, lanes, keyed)
	}
}

// Given the broker has stored ids 1..2, an entry of ids 19..20 in flight after them, and an
// out-of-order send numbered 1 forwarded at once (at or below the stored mark),
// when the broker's -1:-1 receipt for that send arrives before the earlier entry's receipt (the
// broker answers duplicates at once),
// then the engine takes it for the entry it names, and both client receipts leave in order once
// the earlier entry is acknowledged.
func TestDuplicateReceiptOvertakingEarlierEntriesIsMatched(t *testing.T) {
	p := newEngine(t, Policy{Kind: Coalesce}, -1)
	var out Output
	send(t, p, clientBatch(t, []msg{{payload: "x", seq: 1}, {payload: "y", seq: 2}}, pulsarpb.CompressionType_NONE, nil), &out)
	receiptFor(t, p, 1, 3, 0)
	send(t, p, clientBatch(t, []msg{{payload: "a", seq: 19}, {payload: "b", seq: 20}}, pulsarpb.CompressionType_NONE, nil), &out)
	send(t, p, clientBatch(t, []msg{{payload: "c", seq: 1}}, pulsarpb.CompressionType_NONE, nil), &out)
	dup := ^uint64(0)
	var cout Output
	if err := p.Receipt(wire.SendReceipt{ProducerID: pid, SequenceID: 1, HasMessageID: true, LedgerID: dup, EntryID: dup}, &cout); err != nil {
		t.Fatal(err)
	}
	if len(cout.Client) != 0 {
		t.Fatal("a receipt left before the earlier send's")
	}
	if err := p.Receipt(wire.SendReceipt{ProducerID: pid, SequenceID: 19, HasMessageID: true, LedgerID: 3, EntryID: 1}, &cout); err != nil {
		t.Fatal(err)
	}
	if got := decodeClient(t, cout.Client); fmt.Sprint(got) != fmt.Sprint([]receipt{{seq: 19, ledger: 3, entry: 1}, {seq: 1, ledger: dup, entry: dup}}) {
		t.Fatalf("receipts %+v", got)
	}
}

// receiptFor sends the engine's open batches and has the broker acknowledge the entry in
// flight whose first id is seq.
func receiptFor(t *testing.T, p *Producer, seq, ledger, entry uint64) {
	t.Helper()
	var out Output
	if err := p.Flush(&out); err != nil {
		t.Fatal(err)
	}
	if err := p.Receipt(wire.SendReceipt{ProducerID: pid, SequenceID: seq, HasMessageID: true, LedgerID: ledger, EntryID: entry}, &out); err != nil {
		t.Fatal(err)
	}
}

// Given an engine with its entry of ids 19..20 in flight and a send numbered 5 held behind it,
// when a send numbered 21 is made into an entry before the broker's receipt arrives,
// then nothing reaches the broker until the receipt for 19..20, which releases 5 and then 21, in
// the client's order: with de-duplication off the broker stores all three, in that order.
func TestFramesAfterAHeldSendWaitBehindIt(t *testing.T) {
	p, _, out := engineWithHeldSend(t)
	out.Broker = out.Broker[:0]
	send(t, p, clientBatch(t, []msg{{payload: "d", seq: 21}}, pulsarpb.CompressionType_NONE, nil), out)
	if err := p.Tick(t0.Add(time.Hour), out); err != nil { // past max delay: 21's batch is sent
		t.Fatal(err)
	}
	if len(out.Broker) != 0 || p.HeldBytes() == 0 {
		t.Fatalf("%d bytes reached the broker ahead of the held send; %d held", len(out.Broker), p.HeldBytes())
	}

	rout := receiptFor19(t, p)

	var got []string
	for _, e := range decodeEntries(t, rout.Broker) {
		got = append(got, fmt.Sprintf("%d:%s", e.send.SequenceID, strings.Join(e.bodies, "")))
	}
	if want := "[5:c 21:d]"; fmt.Sprint(got) != want || p.HeldBytes() != 0 {
		t.Fatalf("after the receipt the broker got %v, want %s; %d bytes still held", got, want, p.HeldBytes())
	}
}

// Given an engine with its entry of ids 19..20 in flight and a send numbered 5 held behind it,
// when the client's producer is flushed before its CLOSE_PRODUCER goes on (CloseLanes),
// then the held send is written now, ahead of the close, as on a direct connection.
func TestAHeldSendGoesBeforeTheProducersClose(t *testing.T) {
	p, late, out := engineWithHeldSend(t)
	out.Broker = out.Broker[:0]

	if _, err := p.CloseLanes(func() uint64 { return 1 }, true, out); err != nil {
		t.Fatal(err)
	}

	if fs := frames(t, out.Broker); len(fs) != 1 || !bytes.Equal(fs[0].Bytes(), late) {
		t.Fatalf("%d frames written on close, want the held send", len(fs))
	}
}

// engineWithHeldSend returns a coalesce engine that has sent the entry 19..20 (in flight) and
// holds the send numbered 5 behind it, that send's frame, and the engine's output so far.
func engineWithHeldSend(t *testing.T) (*Producer, []byte, *Output) {
	t.Helper()
	p := newEngine(t, Policy{Kind: Coalesce}, -1)
	out := &Output{}
	send(t, p, clientBatch(t, []msg{{payload: "a", seq: 19}, {payload: "b", seq: 20}}, pulsarpb.CompressionType_NONE, nil), out)
	late := clientBatch(t, []msg{{payload: "c", seq: 5}}, pulsarpb.CompressionType_NONE, nil)
	send(t, p, late, out)
	return p, late, out
}

// receiptFor19 has the broker acknowledge the entry 19..20 and returns the engine's output.
func receiptFor19(t *testing.T, p *Producer) Output {
	t.Helper()
	var out Output
	if err := p.Receipt(wire.SendReceipt{ProducerID: pid, SequenceID: 19, HighestSequenceID: 20, HasMessageID: true, LedgerID: 3, EntryID: 1}, &out); err != nil {
		t.Fatal(err)
	}
	return out
}
