package rebatch

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/route"
	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// openBuckets returns a buckets engine whose lanes are open, each lane's broker producer id
// 1000+i and last_sequence_id last[i] (or -1).
func openBuckets(t *testing.T, n int, last []int64) (*Producer, []uint64) {
	t.Helper()
	p, err := NewProducer(Config{Policy: Policy{Kind: Buckets, Buckets: n}, ProducerID: pid, ProducerName: "p", LastSequenceID: -1})
	if err != nil {
		t.Fatal(err)
	}
	next := uint64(1000)
	var out Output
	like := &pulsarpb.CommandProducer{Schema: &pulsarpb.Schema{Name: strp("s"), SchemaData: []byte("{}"), Type: pulsarpb.Schema_Json.Enum()},
		Encrypted: proto.Bool(true), TxnEnabled: proto.Bool(true), Metadata: []*pulsarpb.KeyValue{{Key: strp("app"), Value: strp("x")}}}
	if err := p.OpenLanes("persistent://a/b/t", like, func() uint64 { next++; return next }, &out); err != nil {
		t.Fatal(err)
	}
	var lanes []uint64
	for i, f := range frames(t, out.Broker) {
		var cmd pulsarpb.BaseCommand
		if err := wire.DecodeCommand(f, &cmd); err != nil {
			t.Fatal(err)
		}
		pr := cmd.GetProducer()
		if pr.GetProducerName() != LaneName("p", i) || pr.GetTopic() != "persistent://a/b/t" || !pr.GetUserProvidedProducerName() || pr.GetSchema().GetName() != "s" ||
			!pr.GetEncrypted() || !pr.GetTxnEnabled() || len(pr.GetMetadata()) != 1 || pr.GetMetadata()[0].GetValue() != "x" {
			t.Fatalf("lane %d PRODUCER %v", i, pr)
		}
		if !p.OwnsRequest(pr.GetRequestId()) || p.Ready() {
			t.Fatalf("lane %d request not owned or engine ready too early", i)
		}
		l := int64(-1)
		if last != nil {
			l = last[i]
		}
		ready := p.LaneOpened(pr.GetRequestId(), l)
		if ready != (i == n-1) {
			t.Fatalf("ready=%v after lane %d of %d", ready, i, n)
		}
		lanes = append(lanes, pr.GetProducerId())
	}
	if len(lanes) != n {
		t.Fatalf("%d lanes opened, want %d", len(lanes), n)
	}
	return p, lanes
}

func strp(s string) *string { return &s }

// Given the buckets policy with 4 buckets and its lanes open,
// when a client batch of 40 keyed messages arrives and is flushed,
// then each entry goes to the broker producer of one bucket, holds only keys of that bucket,
// carries the hashB range of its keys in entry_hash_min/max and an outer ordering key from one
// of them, and the client's single receipt comes only after every lane acknowledged.
func TestBucketsBatchPerBucketAndStampHashRange(t *testing.T) {
	p, lanes := openBuckets(t, 4, nil)
	ring, _ := route.NewEqualBuckets(4)
	var msgs []msg
	for i := 0; i < 40; i++ {
		msgs = append(msgs, msg{key: fmt.Sprintf("key-%d", i), payload: fmt.Sprint(i), seq: uint64(i)})
	}
	var out Output
	send(t, p, clientBatch(t, msgs, pulsarpb.CompressionType_NONE, nil), &out)
	if err := p.Flush(&out); err != nil {
		t.Fatal(err)
	}
	entries := decodeEntries(t, out.Broker)
	if len(entries) != 4 {
		t.Fatalf("%d entries, want one per bucket", len(entries))
	}
	total := 0
	for _, e := range entries {
		lane := -1
		for i, id := range lanes {
			if id == e.send.ProducerID {
				lane = i
			}
		}
		if lane < 0 || e.md.GetProducerName() != LaneName("p", lane) {
			t.Fatalf("entry sent by producer %d (%q), not a lane", e.send.ProducerID, e.md.GetProducerName())
		}
		lo, hi := uint16(65535), uint16(0)
		prev := int64(-1)
		for _, m := range e.msgs {
			h := route.HashB(m.PartitionKey)
			if ring.Bucket(h) != lane {
				t.Fatalf("key %q (hashB %d) in lane %d", m.PartitionKey, h, lane)
			}
			lo, hi = min(lo, h), max(hi, h)
			if int64(m.SequenceID) <= prev {
				t.Fatalf("lane %d sequence ids not rising", lane)
			}
			prev = int64(m.SequenceID)
		}
		if e.md.EntryHashMin == nil || e.md.GetEntryHashMin() != uint32(lo) || e.md.GetEntryHashMax() != uint32(hi) {
			t.Fatalf("lane %d entry hash range %v..%v, want %d..%d", lane, e.md.EntryHashMin, e.md.EntryHashMax, lo, hi)
		}
		if h := route.HashB(e.md.OrderingKey); ring.Bucket(h) != lane {
			t.Fatalf("lane %d outer ordering key %q hashes to bucket %d", lane, e.md.OrderingKey, ring.Bucket(h))
		}
		if e.send.SequenceID != e.msgs[0].SequenceID || e.send.HighestSequenceID != e.msgs[len(e.msgs)-1].SequenceID {
			t.Fatalf("lane %d entry sequence range %d..%d", lane, e.send.SequenceID, e.send.HighestSequenceID)
		}
		total += len(e.msgs)
	}
	if total != 40 {
		t.Fatalf("%d messages in entries, sent 40", total)
	}
	// Acknowledge lanes in reverse order: the client's receipt waits for the last one.
	var cout Output
	for i := len(entries) - 1; i >= 0; i-- {
		e := entries[i]
		if len(cout.Client) != 0 {
			t.Fatal("client receipt before every lane acknowledged")
		}
		if err := p.Receipt(wire.SendReceipt{ProducerID: e.send.ProducerID, SequenceID: e.send.SequenceID, HasMessageID: true, LedgerID: 3, EntryID: uint64(i)}, &cout); err != nil {
			t.Fatal(err)
		}
	}
	firstEntry := -1
	for i, e := range entries {
		if e.msgs[0].SequenceID == 0 {
			firstEntry = i
		}
	}
	got := decodeClient(t, cout.Client)
	if len(got) != 1 || got[0].seq != 0 || got[0].isError || got[0].entry != uint64(firstEntry) {
		t.Fatalf("client receipts %+v, want one for sequence 0 naming entry %d (its first message's)", got, firstEntry)
	}
}

// Given bucket lanes whose brokers persisted up to different sequence ids (a proxy restart),
// when the client resends its pending batch,
// then in each lane the messages at or below that lane's mark go in an entry of duplicates
// of their own, the rest in a normal entry, and the client is told the highest mark.
func TestBucketsResendIsCutAtEachLanesMark(t *testing.T) {
	marks := []int64{5, -1}
	p, _ := openBuckets(t, 2, marks)
	if got := p.LastSequenceID(); got != 5 {
		t.Fatalf("LastSequenceID %d, want 5", got)
	}
	ring, _ := route.NewEqualBuckets(2)
	var msgs []msg
	for i := 0; i < 12; i++ {
		msgs = append(msgs, msg{key: fmt.Sprintf("key-%d", i), payload: fmt.Sprint(i), seq: uint64(i)})
	}
	var out Output
	send(t, p, clientBatch(t, msgs, pulsarpb.CompressionType_NONE, nil), &out)
	_ = p.Flush(&out)
	for _, e := range decodeEntries(t, out.Broker) {
		lane := ring.Bucket(route.HashB(e.msgs[0].PartitionKey))
		dup := int64(e.msgs[0].SequenceID) <= marks[lane]
		for _, m := range e.msgs {
			if (int64(m.SequenceID) <= marks[lane]) != dup {
				t.Fatalf("lane %d entry mixes duplicates and new messages (mark %d): %d", lane, marks[lane], m.SequenceID)
			}
		}
	}
}

func TestBucketsPolicyValidation(t *testing.T) {
	for _, tc := range []struct {
		p  Policy
		ok bool
	}{
		{Policy{Kind: Buckets, Buckets: 4}, true},
		{Policy{Kind: Buckets, BucketStarts: []int{0, 16384, 32768, 49152}}, true},
		{Policy{Kind: Buckets}, false},
		{Policy{Kind: Buckets, Buckets: 1000}, false},
		{Policy{Kind: Buckets, BucketStarts: []int{5, 10}}, false},
		{Policy{Kind: Coalesce, Buckets: 4}, false},
	} {
		p := tc.p
		if err := p.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v: Validate() = %v", tc.p, err)
		}
	}
}
