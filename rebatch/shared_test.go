package rebatch

import (
	"fmt"
	"testing"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// Given two client producers under coalesce with merge_producers sharing one lane,
// when each sends three single messages, interleaved, and the shared entry is acknowledged,
// then one entry holds all six messages under the shared producer with the proxy's own
// sequence ids, and each client gets its three receipts, in its own order, with its own
// producer id and sequence ids.
func TestSharedLaneMergesProducersAndReceiptsEachInOrder(t *testing.T) {
	sl := NewSharedLane("shared")
	pol := Policy{Kind: Coalesce, MergeProducers: true, HoldWhenIdle: true}
	mk := func(id uint64, name string) *Producer {
		p, err := NewProducer(Config{Policy: pol, ProducerID: id, ProducerName: name, LastSequenceID: -1, Shared: sl})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	a, b := mk(1, "a"), mk(2, "b")
	var out Output
	next := uint64(100)
	if err := a.OpenLanes("t", nil, func() uint64 { next++; return next }, &out); err != nil {
		t.Fatal(err)
	}
	if err := b.OpenLanes("t", nil, func() uint64 { next++; return next }, &out); err != nil {
		t.Fatal(err)
	}
	if n := len(frames(t, out.Broker)); n != 1 {
		t.Fatalf("%d PRODUCER commands for one shared lane", n)
	}
	var cmd pulsarpb.BaseCommand
	_ = wire.DecodeCommand(frames(t, out.Broker)[0], &cmd)
	req := cmd.GetProducer().GetRequestId()
	if !a.OwnsRequest(req) || !b.OwnsRequest(req) {
		t.Fatal("both engines must wait for the shared lane")
	}
	a.LaneOpened(req, 41)
	if !a.Ready() || !b.Ready() {
		t.Fatal("the shared lane's success must ready every member")
	}
	out = Output{}
	single := func(pid, seq uint64) []byte {
		b := clientSingle(t, msg{payload: fmt.Sprintf("p%d-%d", pid, seq), seq: seq})
		f := frame(t, b)
		md := &pulsarpb.MessageMetadata{}
		_ = wire.DecodeMetadata(f.Metadata(), md)
		r, err := wire.AppendSendFrameMetadata(nil, &wire.Send{ProducerID: pid, SequenceID: seq}, md, f.Payload())
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for seq := uint64(0); seq < 3; seq++ {
		if err := a.Send(t0, frame(t, single(1, seq)), &out); err != nil {
			t.Fatal(err)
		}
		if err := b.Send(t0, frame(t, single(2, seq+10)), &out); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Flush(&out); err != nil {
		t.Fatal(err)
	}
	entries := decodeEntries(t, out.Broker)
	if len(entries) != 1 || len(entries[0].msgs) != 6 || entries[0].md.GetProducerName() != "shared" {
		t.Fatalf("entries %+v", entries)
	}
	e := entries[0]
	if e.send.ProducerID != sl.ProducerID() || e.send.SequenceID != 42 || e.send.HighestSequenceID != 47 {
		t.Fatalf("shared entry producer %d sequence %d..%d, want lane %d and 42..47", e.send.ProducerID, e.send.SequenceID, e.send.HighestSequenceID, sl.ProducerID())
	}
	var cout Output
	if err := a.Receipt(wire.SendReceipt{ProducerID: sl.ProducerID(), SequenceID: 42, HasMessageID: true, LedgerID: 5, EntryID: 6}, &cout); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range frames(t, cout.Client) {
		r, err := wire.ParseSendReceipt(f)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%d:%d@%d:%d", r.ProducerID, r.SequenceID, r.LedgerID, r.EntryID))
	}
	if fmt.Sprint(got) != "[1:0@5:6 1:1@5:6 1:2@5:6 2:10@5:6 2:11@5:6 2:12@5:6]" {
		t.Fatalf("receipts %v", got)
	}
	if a.LastSequenceID() != -1 {
		t.Fatalf("the shared lane's ids leaked into the client's last_sequence_id: %d", a.LastSequenceID())
	}
}

// Given two client producers sharing one lane, one made before a SIGHUP turned split_keys off
// and one after,
// when the first opens a batch with a keyed message and the second's Flush sends it,
// then the entry is built from the opening engine's group layout: no outer properties are
// decoded from the routing class, and nothing panics.
func TestSharedLaneBatchKeepsItsOpenersGroupLayout(t *testing.T) {
	sl := NewSharedLane("shared")
	mk := func(id uint64, name string, pol Policy) *Producer {
		pol.MergeProducers, pol.HoldWhenIdle = true, true
		p, err := NewProducer(Config{Policy: pol, ProducerID: id, ProducerName: name, LastSequenceID: -1, Shared: sl})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	before, after := mk(pid, "a", Policy{Kind: Coalesce}), mk(pid+1, "b", Policy{Kind: Coalesce, SplitKeys: mixKeys})
	var out Output
	next := uint64(100)
	for _, p := range []*Producer{before, after} {
		if err := p.OpenLanes("t", nil, func() uint64 { next++; return next }, &out); err != nil {
			t.Fatal(err)
		}
	}
	var cmd pulsarpb.BaseCommand
	_ = wire.DecodeCommand(frames(t, out.Broker)[0], &cmd)
	before.LaneOpened(cmd.GetProducer().GetRequestId(), -1)
	out = Output{}
	if err := before.Send(t0, frame(t, clientSingle(t, msg{key: "k", payload: "x", seq: 0})), &out); err != nil {
		t.Fatal(err)
	}
	if err := after.Flush(&out); err != nil {
		t.Fatal(err)
	}
	entries := decodeEntries(t, out.Broker)
	if len(entries) != 1 || len(entries[0].msgs) != 1 || len(entries[0].md.Properties) != 0 {
		t.Fatalf("entries %+v", entries)
	}
}
