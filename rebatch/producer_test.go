package rebatch

import (
	"bytes"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/batch"
	"github.com/rebatchproxy/rebatchproxy/wire/compression"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

const pid = 7

var t0 = time.Unix(1_700_000_000, 0)

// msg is one message a test client sends.
type msg struct {
	key     string
	props   map[string]string
	payload string
	seq     uint64
}

func kvs(m map[string]string) []*pulsarpb.KeyValue {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []*pulsarpb.KeyValue
	for _, k := range keys {
		out = append(out, &pulsarpb.KeyValue{Key: proto.String(k), Value: proto.String(m[k])})
	}
	return out
}

// clientBatch encodes a SEND frame as a batching client builds it: per-message sequence ids in
// the SingleMessageMetadata, the batch's first sequence id on the command.
func clientBatch(t testing.TB, msgs []msg, codec pulsarpb.CompressionType, schema []byte) []byte {
	t.Helper()
	var buf []byte
	for _, m := range msgs {
		smm := &pulsarpb.SingleMessageMetadata{Properties: kvs(m.props), SequenceId: proto.Uint64(m.seq), PayloadSize: proto.Int32(int32(len(m.payload)))}
		if m.key != "" {
			smm.PartitionKey = proto.String(m.key)
		}
		var err error
		if buf, err = batch.AppendNewMessage(buf, smm, []byte(m.payload)); err != nil {
			t.Fatal(err)
		}
	}
	md := &pulsarpb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(msgs[0].seq), PublishTime: proto.Uint64(42),
		NumMessagesInBatch: proto.Int32(int32(len(msgs))), UncompressedSize: proto.Uint32(uint32(len(buf))), SchemaVersion: schema}
	payload := buf
	if codec != pulsarpb.CompressionType_NONE {
		md.Compression = codec.Enum()
		var err error
		if payload, err = compression.Compress(nil, codec, buf); err != nil {
			t.Fatal(err)
		}
	}
	s := wire.Send{ProducerID: pid, SequenceID: msgs[0].seq, NumMessages: int32(len(msgs))}
	f, err := wire.AppendSendFrameMetadata(nil, &s, md, payload)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// clientSingle encodes a SEND frame of one message sent without batching.
func clientSingle(t testing.TB, m msg) []byte {
	t.Helper()
	md := &pulsarpb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(m.seq), PublishTime: proto.Uint64(42), Properties: kvs(m.props)}
	if m.key != "" {
		md.PartitionKey = proto.String(m.key)
	}
	s := wire.Send{ProducerID: pid, SequenceID: m.seq}
	f, err := wire.AppendSendFrameMetadata(nil, &s, md, []byte(m.payload))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func frame(t testing.TB, b []byte) wire.Frame {
	t.Helper()
	f, n, err := wire.ReadFrame(b, 5<<20)
	if err != nil || n != len(b) {
		t.Fatalf("ReadFrame: n=%d of %d, err %v", n, len(b), err)
	}
	return f
}

func frames(t testing.TB, b []byte) []wire.Frame {
	t.Helper()
	var out []wire.Frame
	for len(b) > 0 {
		f, n, err := wire.ReadFrame(b, 5<<20)
		if err != nil {
			t.Fatalf("ReadFrame: %v", err)
		}
		out = append(out, f)
		b = b[n:]
	}
	return out
}

// entry is a broker-bound SEND the engine built, decoded.
type entry struct {
	send   wire.Send
	md     *pulsarpb.MessageMetadata
	msgs   []batch.SingleMeta
	bodies []string
	raw    []byte
}

func decodeEntries(t testing.TB, b []byte) []entry {
	t.Helper()
	var out []entry
	for _, f := range frames(t, b) {
		if err := f.VerifyChecksum(); err != nil {
			t.Fatalf("entry checksum: %v", err)
		}
		s, err := wire.ParseSend(f)
		if err != nil {
			t.Fatal(err)
		}
		md := &pulsarpb.MessageMetadata{}
		if err := wire.DecodeMetadata(f.Metadata(), md); err != nil {
			t.Fatal(err)
		}
		e := entry{send: s, md: md, raw: f.Bytes()}
		if md.NumMessagesInBatch != nil {
			payload := f.Payload()
			if md.GetCompression() != pulsarpb.CompressionType_NONE {
				if payload, err = compression.Decompress(nil, md.GetCompression(), payload, int(md.GetUncompressedSize()), 0); err != nil {
					t.Fatal(err)
				}
			}
			it := batch.NewIterator(payload, int(md.GetNumMessagesInBatch()))
			for it.Next() {
				e.msgs = append(e.msgs, it.Meta())
				e.bodies = append(e.bodies, string(it.Message().Payload))
			}
			if err := it.Err(); err != nil {
				t.Fatal(err)
			}
		}
		out = append(out, e)
	}
	return out
}

type receipt struct {
	seq, highest  uint64
	ledger, entry uint64
	isError       bool
}

func decodeClient(t testing.TB, b []byte) []receipt {
	t.Helper()
	var out []receipt
	for _, f := range frames(t, b) {
		switch f.Type() {
		case pulsarpb.BaseCommand_SEND_RECEIPT:
			r, err := wire.ParseSendReceipt(f)
			if err != nil {
				t.Fatal(err)
			}
			if r.ProducerID != pid {
				t.Fatalf("receipt for producer %d", r.ProducerID)
			}
			out = append(out, receipt{seq: r.SequenceID, highest: r.HighestSequenceID, ledger: r.LedgerID, entry: r.EntryID})
		case pulsarpb.BaseCommand_SEND_ERROR:
			var cmd pulsarpb.BaseCommand
			if err := wire.DecodeCommand(f, &cmd); err != nil {
				t.Fatal(err)
			}
			out = append(out, receipt{seq: cmd.SendError.GetSequenceId(), isError: true})
		default:
			t.Fatalf("engine wrote %v to the client", f.Type())
		}
	}
	return out
}

// newEngine returns an engine that holds batches open until a limit or the delay (the rules
// under test); TestIdleLaneSendsAtOnceAndBatchesWhileInFlight covers the default group commit.
func newEngine(t testing.TB, pol Policy, last int64) *Producer {
	t.Helper()
	pol.HoldWhenIdle = true
	p, err := NewProducer(Config{Policy: pol, ProducerID: pid, ProducerName: "p", LastSequenceID: last})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func send(t testing.TB, p *Producer, b []byte, out *Output) {
	t.Helper()
	if err := p.Send(t0, frame(t, b), out); err != nil {
		t.Fatalf("Send: %v", err)
	}
}

// ack acknowledges every entry in out.Broker in order, as the broker would, storing entry i
// at ledger 9, entry firstEntry+i.
func ack(t testing.TB, p *Producer, entries []entry, firstEntry uint64, out *Output) {
	t.Helper()
	for i, e := range entries {
		r := wire.SendReceipt{ProducerID: pid, SequenceID: e.send.SequenceID, HighestSequenceID: e.send.HighestSequenceID, HasMessageID: true, LedgerID: 9, EntryID: firstEntry + uint64(i)}
		if err := p.Receipt(r, out); err != nil {
			t.Fatalf("Receipt %d: %v", i, err)
		}
	}
}

func propsOf(t testing.TB, m batch.SingleMeta) string {
	t.Helper()
	var parts []string
	_ = m.Properties(func(k, v []byte) bool { parts = append(parts, string(k)+":"+string(v)); return true })
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func outerProps(md *pulsarpb.MessageMetadata) string {
	var parts []string
	for _, kv := range md.Properties {
		parts = append(parts, kv.GetKey()+":"+kv.GetValue())
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// pip191Messages are msg1..msg8 of PIP-191's worked example.
func pip191Messages() []msg {
	props := []map[string]string{
		{"region": "eu"},
		{"region": "eu"},
		{"region": "eu", "version": "1", "tag": "a"},
		{"region": "eu", "version": "1"},
		{"region": "us", "version": "1"},
		{"region": "us", "version": "2"},
		{"region": "us", "version": "5"},
		{"region": "us", "version": "6"},
	}
	var out []msg
	for i, p := range props {
		out = append(out, msg{props: p, payload: fmt.Sprintf("msg%d", i+1), seq: uint64(i)})
	}
	return out
}

var pip191Policy = Policy{Kind: Properties, HoldWhenIdle: true, Restricted: map[string][]string{"region": {"us", "eu"}, "version": {"1", "2"}}}

// The golden test of DESIGN.md: PIP-191's table, batch1..batch5.
var pip191Want = []struct {
	outer    string
	payloads []string
}{
	{"region:eu", []string{"msg1", "msg2"}},
	{"region:eu,version:1", []string{"msg3", "msg4"}},
	{"region:us,version:1", []string{"msg5"}},
	{"region:us,version:2", []string{"msg6"}},
	{"region:us", []string{"msg7", "msg8"}},
}

func checkPIP191(t *testing.T, got []entry, msgs []msg) {
	t.Helper()
	if len(got) != len(pip191Want) {
		t.Fatalf("%d entries, want %d", len(got), len(pip191Want))
	}
	next := 0
	for i, w := range pip191Want {
		e := got[i]
		if o := outerProps(e.md); o != w.outer {
			t.Errorf("batch%d outer properties %q, want %q", i+1, o, w.outer)
		}
		if strings.Join(e.bodies, " ") != strings.Join(w.payloads, " ") {
			t.Errorf("batch%d payloads %v, want %v", i+1, e.bodies, w.payloads)
		}
		if e.md.NumMessagesInBatch == nil || int(e.md.GetNumMessagesInBatch()) != len(w.payloads) {
			t.Errorf("batch%d num_messages_in_batch %v, want %d", i+1, e.md.NumMessagesInBatch, len(w.payloads))
		}
		for j, m := range e.msgs {
			want := msgs[next]
			if got := propsOf(t, m); got != outerProps(&pulsarpb.MessageMetadata{Properties: kvs(want.props)}) {
				t.Errorf("batch%d message %d properties %q changed", i+1, j, got)
			}
			if !m.HasSequenceID || m.SequenceID != want.seq {
				t.Errorf("batch%d message %d sequence id %d, want %d", i+1, j, m.SequenceID, want.seq)
			}
			next++
		}
		if e.send.SequenceID != e.msgs[0].SequenceID || e.send.HighestSequenceID != e.msgs[len(e.msgs)-1].SequenceID {
			t.Errorf("batch%d send sequence range %d..%d, want its messages' %d..%d", i+1, e.send.SequenceID, e.send.HighestSequenceID, e.msgs[0].SequenceID, e.msgs[len(e.msgs)-1].SequenceID)
		}
	}
}

// Given the properties policy of PIP-191's example (region: us, eu; version: 1, 2),
// when msg1..msg8 arrive in one client batch,
// then the engine builds exactly batch1..batch5 of the PIP's table.
func TestPropertiesPIP191WorkedExampleFromOneClientBatch(t *testing.T) {
	p := newEngine(t, pip191Policy, -1)
	msgs := pip191Messages()
	var out Output
	send(t, p, clientBatch(t, msgs, pulsarpb.CompressionType_NONE, nil), &out)
	if err := p.Flush(&out); err != nil {
		t.Fatal(err)
	}
	checkPIP191(t, decodeEntries(t, out.Broker), msgs)
}

// Given the same policy,
// when msg1..msg8 arrive as eight unbatched sends,
// then the entries are the same five batches, in batch format.
func TestPropertiesPIP191WorkedExampleFromSingleSends(t *testing.T) {
	p := newEngine(t, pip191Policy, -1)
	msgs := pip191Messages()
	var out Output
	for _, m := range msgs {
		send(t, p, clientSingle(t, m), &out)
	}
	if err := p.Flush(&out); err != nil {
		t.Fatal(err)
	}
	checkPIP191(t, decodeEntries(t, out.Broker), msgs)
}

// Given a client batch split by the properties policy into five entries,
// when the broker acknowledges the first four entries,
// then the client has no receipt yet; the fifth releases exactly one receipt carrying the
// client's own sequence id and the ledger:entry of the entry holding its first message.
func TestReceiptWaitsForEveryPartOfASplitSend(t *testing.T) {
	p := newEngine(t, pip191Policy, -1)
	var out Output
	send(t, p, clientBatch(t, pip191Messages(), pulsarpb.CompressionType_NONE, nil), &out)
	if err := p.Flush(&out); err != nil {
		t.Fatal(err)
	}
	entries := decodeEntries(t, out.Broker)
	out.Broker = out.Broker[:0]
	ack(t, p, entries[:4], 100, &out)
	if len(out.Client) != 0 {
		t.Fatalf("client got %v before every part was stored", decodeClient(t, out.Client))
	}
	ack(t, p, entries[4:], 104, &out)
	got := decodeClient(t, out.Client)
	if len(got) != 1 || got[0] != (receipt{seq: 0, ledger: 9, entry: 100}) {
		t.Fatalf("receipts %+v, want one for sequence 0 at 9:100", got)
	}
}

// Given the coalesce policy merging across keys,
// when ten unbatched sends of ten keys arrive and the delay expires,
// then one entry holds all ten in order, and its receipt releases ten client receipts in the
// client's order, each with its own sequence id.
func TestCoalesceMergesConsecutiveSendsAndReceiptsEachInOrder(t *testing.T) {
	p := newEngine(t, Policy{Kind: Coalesce, SplitKeys: mixKeys}, -1)
	var out Output
	for i := 0; i < 10; i++ {
		send(t, p, clientSingle(t, msg{key: fmt.Sprintf("k%d", i), props: map[string]string{"i": fmt.Sprint(i)}, payload: fmt.Sprintf("m%d", i), seq: uint64(i)}), &out)
	}
	if len(out.Broker) != 0 {
		t.Fatal("flushed before the delay")
	}
	d, ok := p.Deadline()
	if !ok || !d.Equal(t0.Add(DefaultMaxDelay)) {
		t.Fatalf("deadline %v %v", d, ok)
	}
	if err := p.Tick(d, &out); err != nil {
		t.Fatal(err)
	}
	entries := decodeEntries(t, out.Broker)
	if len(entries) != 1 || len(entries[0].msgs) != 10 {
		t.Fatalf("%d entries", len(entries))
	}
	e := entries[0]
	if e.send.SequenceID != 0 || e.send.HighestSequenceID != 9 || e.send.NumMessages != 10 || e.md.GetProducerName() != "p" || e.md.GetPartitionKey() != "k0" {
		t.Fatalf("entry send %+v metadata %v", e.send, e.md)
	}
	for i, m := range e.msgs {
		if string(m.PartitionKey) != fmt.Sprintf("k%d", i) || e.bodies[i] != fmt.Sprintf("m%d", i) || propsOf(t, m) != fmt.Sprintf("i:%d", i) {
			t.Fatalf("message %d: key %q body %q props %q", i, m.PartitionKey, e.bodies[i], propsOf(t, m))
		}
	}
	if len(e.md.Properties) != 0 {
		t.Fatalf("coalesce stamped outer properties %v", e.md.Properties)
	}
	ack(t, p, entries, 5, &out)
	got := decodeClient(t, out.Client)
	for i, r := range got {
		if r != (receipt{seq: uint64(i), ledger: 9, entry: 5}) {
			t.Fatalf("receipt %d = %+v", i, r)
		}
	}
	if len(got) != 10 || p.Pending() != 0 {
		t.Fatalf("%d receipts, %d pending", len(got), p.Pending())
	}
}

// Given an open batch of two messages,
// when a send that is never merged arrives (a chunk, a send of a transaction, the first
// transaction of coordinator 0 included, whose id (0, 0) is present though zero, or one with a
// metadata field an entry the proxy builds would not carry),
// then the open batch is flushed first and that send follows as its original bytes.
func TestNeverMergedSendFlushesOpenBatchThenGoesVerbatim(t *testing.T) {
	plain := &pulsarpb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(2), PublishTime: proto.Uint64(1)}
	chunked := &pulsarpb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(2), PublishTime: proto.Uint64(1),
		Uuid: proto.String("p-2"), ChunkId: proto.Int32(0), NumChunksFromMsg: proto.Int32(2), TotalChunkMsgSize: proto.Int32(8)}
	cases := []struct {
		name string
		send wire.Send
		md   *pulsarpb.MessageMetadata
	}{
		{"chunk", wire.Send{ProducerID: pid, SequenceID: 2, IsChunk: true}, chunked},
		{"transaction (0, 0)", wire.Send{ProducerID: pid, SequenceID: 2, HasTxnID: true}, plain},
		{"transaction (1, 7)", wire.Send{ProducerID: pid, SequenceID: 2, HasTxnID: true, TxnIDMostBits: 1, TxnIDLeastBits: 7}, plain},
		// An entry-level field the engine would not carry into an entry it builds.
		{"schema id", wire.Send{ProducerID: pid, SequenceID: 2}, &pulsarpb.MessageMetadata{ProducerName: proto.String("p"),
			SequenceId: proto.Uint64(2), PublishTime: proto.Uint64(1), SchemaId: []byte{1, 2}}},
	}
	build := map[string]func() ([]byte, error){}
	for _, c := range cases {
		build[c.name] = func() ([]byte, error) { return wire.AppendSendFrameMetadata(nil, &c.send, c.md, []byte("special")) }
	}
	// A command field a newer client might send (10), which a built entry's SEND would not carry.
	build["unknown command field"] = func() ([]byte, error) {
		cmd := &pulsarpb.CommandSend{ProducerId: proto.Uint64(pid), SequenceId: proto.Uint64(2)}
		cmd.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 10, protowire.VarintType), 1))
		return wire.AppendPayloadFrame(nil, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_SEND.Enum(), Send: cmd}, plain, []byte("special"))
	}
	for name, frame := range build {
		t.Run(name, func(t *testing.T) {
			p := newEngine(t, Policy{Kind: Coalesce}, -1)
			var out Output
			send(t, p, clientSingle(t, msg{payload: "a", seq: 0}), &out)
			send(t, p, clientSingle(t, msg{payload: "b", seq: 1}), &out)
			special, err := frame()
			if err != nil {
				t.Fatal(err)
			}

			send(t, p, special, &out)

			fs := frames(t, out.Broker)
			if len(fs) != 2 {
				t.Fatalf("%d frames to the broker", len(fs))
			}
			if !bytes.Equal(fs[1].Bytes(), special) {
				t.Fatal("the send was not forwarded as its original bytes")
			}
			if e := decodeEntries(t, fs[0].Bytes()); len(e[0].msgs) != 2 {
				t.Fatalf("flushed entry holds %d messages", len(e[0].msgs))
			}
		})
	}
}

// Given a producer whose broker de-duplication mark is 4 (sequence ids up to 4 persisted),
// when the client resends a batch of sequence ids 3..7,
// then 3..4 go in an entry of their own and 5..7 in another, so the broker can drop the
// duplicates without dropping the new messages.
func TestResendStraddlingTheDedupMarkIsSplitAtTheMark(t *testing.T) {
	p := newEngine(t, Policy{Kind: Coalesce}, 4)
	var msgs []msg
	for s := uint64(3); s <= 7; s++ {
		msgs = append(msgs, msg{payload: fmt.Sprint(s), seq: s})
	}
	var out Output
	send(t, p, clientBatch(t, msgs, pulsarpb.CompressionType_NONE, nil), &out)
	if err := p.Flush(&out); err != nil {
		t.Fatal(err)
	}
	entries := decodeEntries(t, out.Broker)
	if len(entries) != 2 || entries[0].send.SequenceID != 3 || entries[0].send.HighestSequenceID != 4 ||
		entries[1].send.SequenceID != 5 || entries[1].send.HighestSequenceID != 7 {
		t.Fatalf("entries %+v", entries)
	}
	// The broker answers the duplicate part with -1:-1 and stores the rest.
	var cout Output
	dup := ^uint64(0)
	if err := p.Receipt(wire.SendReceipt{ProducerID: pid, SequenceID: 3, HasMessageID: true, LedgerID: dup, EntryID: dup}, &cout); err != nil {
		t.Fatal(err)
	}
	if err := p.Receipt(wire.SendReceipt{ProducerID: pid, SequenceID: 5, HasMessageID: true, LedgerID: 9, EntryID: 1}, &cout); err != nil {
		t.Fatal(err)
	}
	if got := decodeClient(t, cout.Client); len(got) != 1 || got[0].seq != 3 {
		t.Fatalf("receipts %+v", got)
	}
}

// Given a de-duplication mark of 10,
// when the client resends a send entirely at or below it,
// then the send is forwarded unchanged, as the broker must judge it.
func TestResendBelowTheDedupMarkGoesVerbatim(t *testing.T) {
	p := newEngine(t, Policy{Kind: Coalesce}, 10)
	var out Output
	b := clientBatch(t, []msg{{payload: "x", seq: 9}, {payload: "y", seq: 10}}, pulsarpb.CompressionType_NONE, nil)
	send(t, p, b, &out)
	if !bytes.Equal(out.Broker, b) {
		t.Fatal("resend was rewritten")
	}
}

// Given the coalesce policy with a maximum of 3 messages,
// when a client batch of 7 messages arrives,
// then entries of 3, 3 and (after the delay) 1 messages are built, in order.
func TestMaxMessagesCutsEntries(t *testing.T) {
	p := newEngine(t, Policy{Kind: Coalesce, MaxMessages: 3}, -1)
	var msgs []msg
	for i := 0; i < 7; i++ {
		msgs = append(msgs, msg{payload: fmt.Sprint(i), seq: uint64(i)})
	}
	var out Output
	send(t, p, clientBatch(t, msgs, pulsarpb.CompressionType_NONE, nil), &out)
	if n := len(decodeEntries(t, out.Broker)); n != 2 {
		t.Fatalf("%d entries before the delay, want 2", n)
	}
	if err := p.Tick(t0.Add(time.Second), &out); err != nil {
		t.Fatal(err)
	}
	var sizes []int
	for _, e := range decodeEntries(t, out.Broker) {
		sizes = append(sizes, len(e.msgs))
	}
	if fmt.Sprint(sizes) != "[3 3 1]" {
		t.Fatalf("entry sizes %v", sizes)
	}
	if s := p.Stats(); s.FlushMaxMessages != 2 || s.FlushDelay != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// Given the coalesce policy with a 2 KiB byte budget,
// when five 1,000-byte messages arrive,
// then no entry's payload exceeds the budget.
func TestMaxBytesCutsEntries(t *testing.T) {
	p := newEngine(t, Policy{Kind: Coalesce, MaxBytes: 2 << 10}, -1)
	var out Output
	for i := 0; i < 5; i++ {
		send(t, p, clientSingle(t, msg{payload: strings.Repeat("x", 1000), seq: uint64(i)}), &out)
	}
	if err := p.Flush(&out); err != nil {
		t.Fatal(err)
	}
	entries := decodeEntries(t, out.Broker)
	total := 0
	for _, e := range entries {
		if e.md.GetUncompressedSize() > 2<<10 {
			t.Fatalf("entry of %d bytes", e.md.GetUncompressedSize())
		}
		total += len(e.msgs)
	}
	if total != 5 || len(entries) != 3 {
		t.Fatalf("%d entries holding %d messages", len(entries), total)
	}
}

// Given an LZ4-compressed client batch,
// when it is merged with the coalesce policy,
// then the entry is LZ4-compressed like its input and decodes to the same messages.
func TestCompressedInputKeepsItsCodec(t *testing.T) {
	p := newEngine(t, Policy{Kind: Coalesce}, -1)
	var out Output
	send(t, p, clientBatch(t, []msg{{payload: strings.Repeat("a", 300), seq: 0}, {payload: "b", seq: 1}}, pulsarpb.CompressionType_LZ4, nil), &out)
	if err := p.Flush(&out); err != nil {
		t.Fatal(err)
	}
	e := decodeEntries(t, out.Broker)[0]
	if e.md.GetCompression() != pulsarpb.CompressionType_LZ4 || e.bodies[0] != strings.Repeat("a", 300) || e.bodies[1] != "b" {
		t.Fatalf("codec %v bodies %q", e.md.GetCompression(), e.bodies)
	}
}

// Given an open batch of sends with schema version 1,
// when a send with schema version 2 arrives,
// then the open batch is flushed: an entry has one schema version.
func TestSchemaVersionChangeFlushes(t *testing.T) {
	p := newEngine(t, Policy{Kind: Coalesce}, -1)
	var out Output
	send(t, p, clientBatch(t, []msg{{payload: "a", seq: 0}}, pulsarpb.CompressionType_NONE, []byte{1}), &out)
	send(t, p, clientBatch(t, []msg{{payload: "b", seq: 1}}, pulsarpb.CompressionType_NONE, []byte{2}), &out)
	if err := p.Flush(&out); err != nil {
		t.Fatal(err)
	}
	entries := decodeEntries(t, out.Broker)
	if len(entries) != 2 || !bytes.Equal(entries[0].md.SchemaVersion, []byte{1}) || !bytes.Equal(entries[1].md.SchemaVersion, []byte{2}) {
		t.Fatalf("entries %+v", entries)
	}
}

// Given three sends in one entry and a fourth in the next,
// when the broker fails the first entry,
// then the first three sends get that error, in order, and the fourth still gets its receipt.
func TestBrokerErrorFailsEveryAffectedSendInOrder(t *testing.T) {
	p := newEngine(t, Policy{Kind: Coalesce, MaxMessages: 3}, -1)
	var out Output
	for i := 0; i < 4; i++ {
		send(t, p, clientSingle(t, msg{payload: "x", seq: uint64(i)}), &out)
	}
	if err := p.Flush(&out); err != nil {
		t.Fatal(err)
	}
	entries := decodeEntries(t, out.Broker)
	var cout Output
	if err := p.SendError(pid, 2, pulsarpb.ServerError_PersistenceError, "boom", &cout); err != nil {
		t.Fatal(err)
	}
	ack(t, p, entries[1:], 1, &cout)
	got := decodeClient(t, cout.Client)
	want := []receipt{{seq: 0, isError: true}, {seq: 1, isError: true}, {seq: 2, isError: true}, {seq: 3, ledger: 9, entry: 1}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("client got %+v, want %+v", got, want)
	}
}

// Given one entry in flight,
// when the broker acknowledges a different sequence id,
// then the engine reports ErrUnexpectedReceipt and sends the client nothing.
func TestUnexpectedReceiptIsAnError(t *testing.T) {
	p := newEngine(t, Policy{Kind: Coalesce}, -1)
	var out Output
	send(t, p, clientSingle(t, msg{payload: "x", seq: 5}), &out)
	_ = p.Flush(&out)
	var cout Output
	err := p.Receipt(wire.SendReceipt{ProducerID: pid, SequenceID: 6}, &cout)
	if !errors.Is(err, ErrUnexpectedReceipt) || len(cout.Client) != 0 {
		t.Fatalf("err %v, client bytes %d", err, len(cout.Client))
	}
}

// Given a bound of two pending sends,
// when a third send arrives before any receipt,
// then it is refused with ErrTooManyPending.
func TestPendingSendsAreBounded(t *testing.T) {
	p, err := NewProducer(Config{Policy: Policy{Kind: Coalesce, HoldWhenIdle: true}, ProducerID: pid, ProducerName: "p", LastSequenceID: -1, MaxPendingSends: 2})
	if err != nil {
		t.Fatal(err)
	}
	var out Output
	send(t, p, clientSingle(t, msg{payload: "a", seq: 0}), &out)
	send(t, p, clientSingle(t, msg{payload: "b", seq: 1}), &out)
	if err := p.Send(t0, frame(t, clientSingle(t, msg{payload: "c", seq: 2})), &out); !errors.Is(err, ErrTooManyPending) {
		t.Fatalf("err %v", err)
	}
}

// Given an unbatched send with an event time, an ordering key and a null value,
// when it is wrapped into a batch of one,
// then those fields move into the message's own metadata and the entry is in batch format.
func TestUnbatchedMessageKeepsItsFieldsInsideTheBatch(t *testing.T) {
	p := newEngine(t, Policy{Kind: Coalesce}, -1)
	md := &pulsarpb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(0), PublishTime: proto.Uint64(1),
		EventTime: proto.Uint64(77), OrderingKey: []byte("ok"), PartitionKey: proto.String("pk"), NullValue: proto.Bool(true)}
	b, err := wire.AppendSendFrameMetadata(nil, &wire.Send{ProducerID: pid}, md, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out Output
	send(t, p, b, &out)
	_ = p.Flush(&out)
	e := decodeEntries(t, out.Broker)[0]
	m := e.msgs[0]
	if e.md.GetNumMessagesInBatch() != 1 || m.EventTime != 77 || string(m.OrderingKey) != "ok" || string(m.PartitionKey) != "pk" || !m.NullValue {
		t.Fatalf("entry %v message %+v", e.md, m)
	}
	if string(e.md.OrderingKey) != "ok" {
		t.Fatalf("outer ordering key %q, want the first message's", e.md.OrderingKey)
	}
}

func TestPolicyValidation(t *testing.T) {
	tests := []struct {
		name string
		p    Policy
		ok   bool
	}{
		{"coalesce defaults", Policy{Kind: Coalesce}, true},
		{"unknown kind", Policy{Kind: "buckets2"}, false},
		{"negative", Policy{Kind: Coalesce, MaxMessages: -1}, false},
		{"properties without keys", Policy{Kind: Properties}, false},
		{"restricted on coalesce", Policy{Kind: Coalesce, Restricted: map[string][]string{"a": nil}}, false},
		{"empty key", Policy{Kind: Properties, Restricted: map[string][]string{"": nil}}, false},
		{"properties", pip191Policy, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.p
			err := p.Validate()
			if (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, ok want %v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidPolicy) {
				t.Fatalf("error %v does not wrap ErrInvalidPolicy", err)
			}
		})
	}
}

// Given the coalesce policy,
// when a send arrives whose checksum does not match its metadata and payload,
// then it is forwarded unchanged for the broker to refuse, never rebuilt with a fresh checksum.
func TestCorruptSendIsNotLaundered(t *testing.T) {
	p := newEngine(t, Policy{Kind: Coalesce}, -1)
	b := clientSingle(t, msg{payload: "payload", seq: 0})
	b[len(b)-1] ^= 0xff
	var out Output
	send(t, p, b, &out)
	if !bytes.Equal(out.Broker, b) {
		t.Fatal("a corrupt send was rebuilt")
	}
}

// Given the coalesce policy with its default group commit,
// when a first send arrives with nothing in flight, then nine more while its entry is in
// flight, and then the broker acknowledges the first entry,
// then the first send goes at once alone, as the client built it (it is the entry it would be
// built into: a workload that cannot merge pays nothing for coalesce), and the nine go as one entry when the
// acknowledgement makes the lane idle, without waiting for the delay.
func TestIdleLaneSendsAtOnceAndBatchesWhileInFlight(t *testing.T) {
	p, err := NewProducer(Config{Policy: Policy{Kind: Coalesce}, ProducerID: pid, ProducerName: "p", LastSequenceID: -1})
	if err != nil {
		t.Fatal(err)
	}
	var out Output
	lone := clientSingle(t, msg{payload: "0", seq: 0})
	send(t, p, lone, &out)
	first := decodeEntries(t, out.Broker)
	if len(first) != 1 || !bytes.Equal(first[0].raw, lone) {
		t.Fatalf("the first send was not sent at once as the client built it (the entry it would be alone): %d entries", len(first))
	}
	out.Broker = out.Broker[:0]
	for i := 1; i < 10; i++ {
		send(t, p, clientSingle(t, msg{payload: fmt.Sprint(i), seq: uint64(i)}), &out)
	}
	if len(out.Broker) != 0 {
		t.Fatal("sends were not batched while an entry was in flight")
	}
	if err := p.Receipt(wire.SendReceipt{ProducerID: pid, SequenceID: 0, HasMessageID: true, LedgerID: 1, EntryID: 1}, &out); err != nil {
		t.Fatal(err)
	}
	second := decodeEntries(t, out.Broker)
	if len(second) != 1 || len(second[0].msgs) != 9 {
		t.Fatalf("after the receipt: %d entries, want one of 9 messages", len(second))
	}
	if s := p.Stats(); s.SendsAlone != 1 || s.FlushIdle != 1 || s.FlushDelay != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// clientBatchV08 encodes a batch as pulsar-client-go before v0.10 does: one sequence id for
// the whole batch, none on its messages.
func clientBatchV08(t testing.TB, seq uint64, msgs []msg) []byte {
	t.Helper()
	var buf []byte
	for _, m := range msgs {
		smm := &pulsarpb.SingleMessageMetadata{Properties: kvs(m.props), PayloadSize: proto.Int32(int32(len(m.payload)))}
		var err error
		if buf, err = batch.AppendNewMessage(buf, smm, []byte(m.payload)); err != nil {
			t.Fatal(err)
		}
	}
	md := &pulsarpb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(seq), PublishTime: proto.Uint64(42),
		NumMessagesInBatch: proto.Int32(int32(len(msgs))), UncompressedSize: proto.Uint32(uint32(len(buf))), Properties: kvs(msgs[0].props)}
	f, err := wire.AppendSendFrameMetadata(nil, &wire.Send{ProducerID: pid, SequenceID: seq, NumMessages: int32(len(msgs))}, md, buf)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// Given batches that carry one sequence id for all their messages (old Go clients),
// when two homogeneous ones and then a mixed one arrive under the properties policy,
// then the homogeneous ones are merged whole into an entry whose range is their two ids, each
// message carrying its own batch's id (a consumer would otherwise read the entry's, 5, for d
// and e, where directly it reads 6), and the mixed one, which could only be cut into entries
// sharing one id, goes unchanged.
func TestBatchesNumberedAsOneAreMergedWholeNeverCut(t *testing.T) {
	p := newEngine(t, pip191Policy, -1)
	eu := map[string]string{"region": "eu"}
	us := map[string]string{"region": "us"}
	var out Output
	send(t, p, clientBatchV08(t, 5, []msg{{props: eu, payload: "a"}, {props: eu, payload: "b"}, {props: eu, payload: "c"}}), &out)
	send(t, p, clientBatchV08(t, 6, []msg{{props: eu, payload: "d"}, {props: eu, payload: "e"}}), &out)
	mixed := clientBatchV08(t, 7, []msg{{props: eu, payload: "f"}, {props: us, payload: "g"}})
	send(t, p, mixed, &out)
	fs := frames(t, out.Broker)
	if len(fs) != 2 {
		t.Fatalf("%d frames, want the merged entry and the mixed batch", len(fs))
	}
	e := decodeEntries(t, fs[0].Bytes())[0]
	if e.send.SequenceID != 5 || e.send.HighestSequenceID != 6 || strings.Join(e.bodies, "") != "abcde" || outerProps(e.md) != "region:eu" {
		t.Fatalf("merged entry %d..%d %v %q", e.send.SequenceID, e.send.HighestSequenceID, e.bodies, outerProps(e.md))
	}
	for i, m := range e.msgs {
		if want := []uint64{5, 5, 5, 6, 6}[i]; !m.HasSequenceID || m.SequenceID != want {
			t.Errorf("message %q: sequence id %d (present %v), want %d", e.bodies[i], m.SequenceID, m.HasSequenceID, want)
		}
	}
	if !bytes.Equal(fs[1].Bytes(), mixed) {
		t.Fatal("the mixed batch was cut")
	}
	var cout Output
	for _, r := range []wire.SendReceipt{{ProducerID: pid, SequenceID: 5, HasMessageID: true, LedgerID: 1, EntryID: 1},
		{ProducerID: pid, SequenceID: 7, HasMessageID: true, LedgerID: 1, EntryID: 2}} {
		if err := p.Receipt(r, &cout); err != nil {
			t.Fatal(err)
		}
	}
	got := decodeClient(t, cout.Client)
	if fmt.Sprint(got) != fmt.Sprint([]receipt{{seq: 5, ledger: 1, entry: 1}, {seq: 6, ledger: 1, entry: 1}, {seq: 7, ledger: 1, entry: 2}}) {
		t.Fatalf("receipts %+v", got)
	}
}

// Given a passthrough producer's tracking engine (as after its first chunk),
// when sends and their receipts go through it in steady state,
// then nothing is allocated per send (DESIGN.md: no per-frame allocation in steady state).
func TestTrackOnlySteadyStateDoesNotAllocate(t *testing.T) {
	p, err := NewProducer(Config{TrackOnly: true, ProducerID: pid, ProducerName: "p", LastSequenceID: -1})
	if err != nil {
		t.Fatal(err)
	}
	f := frame(t, clientSingle(t, msg{payload: "x", seq: 3}))
	r := wire.SendReceipt{ProducerID: pid, SequenceID: 3, HasMessageID: true, LedgerID: 1, EntryID: 2}
	var out Output
	step := func() {
		if err := p.Send(t0, f, &out); err != nil {
			t.Fatal(err)
		}
		if err := p.Receipt(r, &out); err != nil {
			t.Fatal(err)
		}
		out.Broker, out.Client = out.Broker[:0], out.Client[:0]
	}
	step() // warm the buffers
	if n := testing.AllocsPerRun(1000, step); n != 0 {
		t.Fatalf("%v allocations per send and receipt", n)
	}
}

// Given an engine under each rewriting policy in steady state (its buffers grown by a first
// round),
// when it takes 1,000 unbatched sends, builds their entries, and gets every receipt,
// then it allocates nothing.
func TestRewritingSteadyStateDoesNotAllocate(t *testing.T) {
	for _, c := range unbatchedCases {
		t.Run(c.name, func(t *testing.T) {
			p, round := unbatchedEngine(t, c.pol, c.msg)
			round()
			built := p.stats.EntriesBuilt
			if n := testing.AllocsPerRun(1, round); n != 0 { // one run: an exact count
				t.Fatalf("%v allocations per 1,000 sends, want 0", n)
			}
			if p.stats.EntriesBuilt == built {
				t.Fatal("no entry built: the spec measures nothing")
			}
		})
	}
}
