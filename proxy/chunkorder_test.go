package proxy

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/chunkdedup"
	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// Duplicate-chunk removal keeps the client's order: when a resent chunk is held on a new
// connection until its original's fate is known (the original is in flight on the old
// connection), the chunks the client sends after it wait behind it. Should the original fail,
// the held copies are forwarded first, in the client's order, and then what followed them, so
// the broker never stores a later chunk of a message before an earlier one.

const chunkTopic = "persistent://public/default/chunks"

// chunkPath is one client connection's producer path, with producer 1 named "p" on
// chunkTopic open, sharing cd with the other connections of the proxy.
func chunkPath(t *testing.T, cd *ChunkDedup, conn uint64) (ProducerPath, *capture) {
	t.Helper()
	p := RebatchPaths(nil, nil, cd, slog.New(slog.NewTextHandler(io.Discard, nil)))(ConnInfo{ID: conn, MaxMessageSize: 5 << 20})
	c := &capture{}
	out := captureOut{t, c}
	if _, err := p.FromClient(cmdFrame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PRODUCER.Enum(), Producer: &pulsarpb.CommandProducer{
		Topic: proto.String(chunkTopic), ProducerId: proto.Uint64(1), RequestId: proto.Uint64(1), ProducerName: proto.String("p")}}), out); err != nil {
		t.Fatal(err)
	}
	if _, err := p.FromBroker(cmdFrame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PRODUCER_SUCCESS.Enum(), ProducerSuccess: &pulsarpb.CommandProducerSuccess{
		RequestId: proto.Uint64(1), ProducerName: proto.String("p"), LastSequenceId: proto.Int64(-1)}}), out); err != nil {
		t.Fatal(err)
	}
	c.broker, c.client = nil, nil
	return p, c
}

// chunkFrame is chunk id of the 3-chunk message with sequence id 5.
func chunkFrame(t *testing.T, id int32) wire.Frame {
	t.Helper()
	b, err := wire.AppendSendFrameMetadata(nil, &wire.Send{ProducerID: 1, SequenceID: 5, IsChunk: true},
		&pulsarpb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(5), PublishTime: proto.Uint64(1),
			Uuid: proto.String("p-5"), ChunkId: proto.Int32(id), NumChunksFromMsg: proto.Int32(3), TotalChunkMsgSize: proto.Int32(300)},
		make([]byte, 100))
	return frameOf(t, b, err)
}

// sentChunkIDs returns the chunk ids of the SENDs the path wrote to the broker, in order.
func sentChunkIDs(t *testing.T, raw [][]byte) []int32 {
	t.Helper()
	var ids []int32
	for _, b := range raw {
		f, _, err := wire.ReadFrame(b, 5<<20)
		if err != nil || f.Type() != pulsarpb.BaseCommand_SEND {
			continue
		}
		var md pulsarpb.MessageMetadata
		if err := wire.DecodeMetadata(f.Metadata(), &md); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, md.GetChunkId())
	}
	return ids
}

// rawOut records the raw frames a path writes to the broker and the commands to the client.
type rawOut struct {
	t      *testing.T
	broker [][]byte
	client []*pulsarpb.BaseCommand
}

func (o *rawOut) ToBroker(b []byte) {
	for len(b) > 0 {
		_, n, err := wire.ReadFrame(b, 5<<20)
		if err != nil {
			o.t.Fatal(err)
		}
		o.broker = append(o.broker, append([]byte(nil), b[:n]...))
		b = b[n:]
	}
}
func (o *rawOut) ToClient(b []byte) { o.client = append(o.client, decodeAll(o.t, b)...) }

// Given chunks 0 and 1 of a message forwarded on an old connection with no receipt yet, and the
// client, reconnected, resending chunks 0 and 1 (held as duplicates) and then chunk 2,
// when the old connection's fate for chunks 0 and 1 becomes known,
// then the new connection's broker receives, in order: nothing but the chunks still missing,
// chunk ids ascending — 0, 1, 2 when the originals failed; 2 alone when they were stored —
// and the client gets the three receipts in order once the broker acknowledges.
func TestHeldChunksKeepTheClientsOrder(t *testing.T) {
	cases := []struct {
		name      string
		originals string // "failed" or "stored"
		want      []int32
	}{
		{"originals failed", "failed", []int32{0, 1, 2}},
		{"originals stored", "stored", []int32{2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cd := NewChunkDedup(chunkdedup.Config{})
			old, _ := chunkPath(t, cd, 1)
			oldOut := &rawOut{t: t}
			for id := int32(0); id < 2; id++ {
				if _, err := old.FromClient(chunkFrame(t, id), oldOut); err != nil {
					t.Fatal(err)
				}
			}
			if len(oldOut.broker) != 2 {
				t.Fatalf("old connection forwarded %d chunks, want 2", len(oldOut.broker))
			}
			cur, _ := chunkPath(t, cd, 2)
			curOut := &rawOut{t: t}
			for id := int32(0); id < 3; id++ {
				if _, err := cur.FromClient(chunkFrame(t, id), curOut); err != nil {
					t.Fatal(err)
				}
			}
			if got := sentChunkIDs(t, curOut.broker); len(got) != 0 {
				t.Fatalf("chunks %v went to the broker while earlier ones were held", got)
			}

			if c.originals == "failed" {
				old.Close()
			} else {
				for id := uint64(0); id < 2; id++ {
					if _, err := old.FromBroker(cmdFrame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_SEND_RECEIPT.Enum(),
						SendReceipt: &pulsarpb.CommandSendReceipt{ProducerId: proto.Uint64(1), SequenceId: proto.Uint64(5),
							MessageId: &pulsarpb.MessageIdData{LedgerId: proto.Uint64(9), EntryId: proto.Uint64(id)}}}), oldOut); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := cur.Tick(time.Now(), curOut); err != nil {
				t.Fatal(err)
			}

			got := sentChunkIDs(t, curOut.broker)
			if len(got) != len(c.want) {
				t.Fatalf("broker got chunks %v, want %v", got, c.want)
			}
			for i := range got {
				if got[i] != c.want[i] {
					t.Fatalf("broker got chunks %v, want %v", got, c.want)
				}
			}
			for i := range got {
				if _, err := cur.FromBroker(cmdFrame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_SEND_RECEIPT.Enum(),
					SendReceipt: &pulsarpb.CommandSendReceipt{ProducerId: proto.Uint64(1), SequenceId: proto.Uint64(5),
						MessageId: &pulsarpb.MessageIdData{LedgerId: proto.Uint64(10), EntryId: proto.Uint64(uint64(i))}}}), curOut); err != nil {
					t.Fatal(err)
				}
			}
			var receipts int
			for _, cmd := range curOut.client {
				if cmd.GetType() == pulsarpb.BaseCommand_SEND_RECEIPT && cmd.GetSendReceipt().GetSequenceId() == 5 {
					receipts++
				}
			}
			if receipts != 3 {
				t.Fatalf("client got %d receipts for its 3 chunks, want 3", receipts)
			}
		})
	}
}

// twoChunkFrame is chunk id of the 2-chunk message with sequence id seq.
func twoChunkFrame(t *testing.T, seq uint64, id int32) wire.Frame {
	t.Helper()
	b, err := wire.AppendSendFrameMetadata(nil, &wire.Send{ProducerID: 1, SequenceID: seq, IsChunk: true},
		&pulsarpb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(seq), PublishTime: proto.Uint64(1),
			Uuid: proto.String("p-" + string(rune('0'+seq))), ChunkId: proto.Int32(id), NumChunksFromMsg: proto.Int32(2), TotalChunkMsgSize: proto.Int32(200)},
		make([]byte, 100))
	return frameOf(t, b, err)
}

// plainFrame is an unbatched, unchunked SEND of producer 1.
func plainFrame(t *testing.T, seq uint64) wire.Frame {
	t.Helper()
	b, err := wire.AppendSendFrameMetadata(nil, &wire.Send{ProducerID: 1, SequenceID: seq},
		&pulsarpb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(seq), PublishTime: proto.Uint64(1)},
		make([]byte, 10))
	return frameOf(t, b, err)
}

func receiptFrame(t *testing.T, seq, ledger, entry uint64) wire.Frame {
	t.Helper()
	return cmdFrame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_SEND_RECEIPT.Enum(),
		SendReceipt: &pulsarpb.CommandSendReceipt{ProducerId: proto.Uint64(1), SequenceId: proto.Uint64(seq),
			MessageId: &pulsarpb.MessageIdData{LedgerId: proto.Uint64(ledger), EntryId: proto.Uint64(entry)}}})
}

// brokerCommands decodes what a path wrote to the broker.
func brokerCommands(t *testing.T, o *rawOut) []*pulsarpb.BaseCommand {
	t.Helper()
	var cmds []*pulsarpb.BaseCommand
	for _, b := range o.broker {
		cmds = append(cmds, decodeAll(t, b)...)
	}
	return cmds
}

// Given the first chunks of messages 5 and 7 in flight on an old connection, and the client,
// reconnected, resending chunk 5 (held), plain message 6, then chunk 7 and closing its producer,
// when the old connection's chunks turn out stored,
// then the new connection sends the broker message 6 and then the CLOSE_PRODUCER (chunk 7 is
// answered, not sent again), and the client gets its receipts in its own order, 5, 6, 7, once
// the broker has acknowledged 6.
func TestQueuedFramesKeepTheClientsOrder(t *testing.T) {
	cd := NewChunkDedup(chunkdedup.Config{})
	old, _ := chunkPath(t, cd, 1)
	oldOut := &rawOut{t: t}
	for _, seq := range []uint64{5, 7} {
		if _, err := old.FromClient(twoChunkFrame(t, seq, 0), oldOut); err != nil {
			t.Fatal(err)
		}
	}
	cur, _ := chunkPath(t, cd, 2)
	curOut := &rawOut{t: t}
	closeProducer := cmdFrame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_CLOSE_PRODUCER.Enum(),
		CloseProducer: &pulsarpb.CommandCloseProducer{ProducerId: proto.Uint64(1), RequestId: proto.Uint64(9)}})
	for _, f := range []wire.Frame{twoChunkFrame(t, 5, 0), plainFrame(t, 6), twoChunkFrame(t, 7, 0), closeProducer} {
		if _, err := cur.FromClient(f, curOut); err != nil {
			t.Fatal(err)
		}
	}
	if len(curOut.broker) != 0 {
		t.Fatalf("%d frames reached the broker while chunk 5 was held", len(curOut.broker))
	}

	for i, seq := range []uint64{5, 7} {
		if _, err := old.FromBroker(receiptFrame(t, seq, 9, uint64(i)), oldOut); err != nil {
			t.Fatal(err)
		}
	}
	if err := cur.Tick(time.Now(), curOut); err != nil {
		t.Fatal(err)
	}

	cmds := brokerCommands(t, curOut)
	if len(cmds) != 2 || cmds[0].GetType() != pulsarpb.BaseCommand_SEND || cmds[0].GetSend().GetSequenceId() != 6 ||
		cmds[1].GetType() != pulsarpb.BaseCommand_CLOSE_PRODUCER {
		t.Fatalf("broker got %v, want SEND 6 then CLOSE_PRODUCER", cmds)
	}
	if _, err := cur.FromBroker(receiptFrame(t, 6, 10, 0), curOut); err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for _, cmd := range curOut.client {
		if cmd.GetType() == pulsarpb.BaseCommand_SEND_RECEIPT {
			got = append(got, cmd.GetSendReceipt().GetSequenceId())
		}
	}
	if len(got) != 3 || got[0] != 5 || got[1] != 6 || got[2] != 7 {
		t.Fatalf("client receipts %v, want [5 6 7]", got)
	}
}

// Contract 7 for the queue behind a held chunk: given chunk 5 held on a new connection while
// its original is in flight on the old one,
// when the client sends more than maxQueuedBytes of later messages,
// then the copies stop at the bound: the send that would exceed it goes to the broker at once.
func TestQueueBehindHeldChunkIsBounded(t *testing.T) {
	cd := NewChunkDedup(chunkdedup.Config{})
	old, _ := chunkPath(t, cd, 1)
	if _, err := old.FromClient(twoChunkFrame(t, 5, 0), &rawOut{t: t}); err != nil {
		t.Fatal(err)
	}
	cur, _ := chunkPath(t, cd, 2)
	curOut := &rawOut{t: t}
	if _, err := cur.FromClient(twoChunkFrame(t, 5, 0), curOut); err != nil {
		t.Fatal(err)
	}
	big := func(seq uint64) wire.Frame {
		b, err := wire.AppendSendFrameMetadata(nil, &wire.Send{ProducerID: 1, SequenceID: seq},
			&pulsarpb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(seq), PublishTime: proto.Uint64(1)},
			make([]byte, 1<<20))
		return frameOf(t, b, err)
	}
	fit := maxQueuedBytes / (1<<20 + 100)

	for seq := uint64(6); seq <= uint64(6+fit); seq++ {
		if _, err := cur.FromClient(big(seq), curOut); err != nil {
			t.Fatal(err)
		}
	}

	cmds := brokerCommands(t, curOut)
	if len(cmds) != 1 || cmds[0].GetSend().GetSequenceId() != uint64(6+fit) {
		t.Fatalf("broker got %d frames, want only the send past the bound (%d)", len(cmds), 6+fit)
	}
}
