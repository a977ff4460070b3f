package proxy

import (
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/rebatch"
	"github.com/rebatchproxy/rebatchproxy/route"
	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// Contract 7 (bounded memory) for producers under a rewriting policy: a
// client that keeps more sends pending than the policy's max_pending_sends
// is slowed (the proxy stops reading its frames while receipts catch up),
// not disconnected.

const backlogTopic = "persistent://public/default/backlog"

// backlogProducer opens producer 1 on backlogTopic through a proxy whose
// coalesce policy (entries of at most 4 messages) allows maxPending sends
// awaiting receipts.
func backlogProducer(t *testing.T, maxPending int) (client, broker net.Conn, logs *logBuffer) {
	t.Helper()
	m, err := route.NewMatcher([]route.Rule[rebatch.Policy]{{Pattern: "public/default/backlog",
		Policy: rebatch.Policy{Kind: rebatch.Coalesce, MaxPendingSends: maxPending, MaxMessages: 4}}})
	if err != nil {
		t.Fatal(err)
	}
	fb := newFakeBroker(t)
	_, addr, logs := startProxy(t, []string{fb.addr()}, func(c *Config) {
		c.ProducerPaths = RebatchPaths(NewPolicies(m), NewRebatchMetrics(), nil, c.Logger)
	})
	client, broker = handshake(t, addr, fb, "")
	send(t, client, frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PRODUCER.Enum(), Producer: &pulsarpb.CommandProducer{
		Topic: proto.String(backlogTopic), ProducerId: proto.Uint64(1), RequestId: proto.Uint64(1), ProducerName: proto.String("p")}}))
	expect(t, broker, pulsarpb.BaseCommand_PRODUCER)
	send(t, broker, frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PRODUCER_SUCCESS.Enum(), ProducerSuccess: &pulsarpb.CommandProducerSuccess{
		RequestId: proto.Uint64(1), ProducerName: proto.String("p"), LastSequenceId: proto.Int64(-1)}}))
	expect(t, client, pulsarpb.BaseCommand_PRODUCER_SUCCESS)
	return client, broker, logs
}

// unbatchedSends returns n unbatched SENDs of producer 1, sequence ids 0..n-1.
func unbatchedSends(t *testing.T, n int) []byte {
	t.Helper()
	var b []byte
	for i := 0; i < n; i++ {
		var err error
		b, err = wire.AppendSendFrameMetadata(b, &wire.Send{ProducerID: 1, SequenceID: uint64(i)},
			&pulsarpb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(uint64(i)), PublishTime: proto.Uint64(1)},
			[]byte("m"))
		if err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// ackEntries reads the broker's SENDs until the client has want receipts,
// acknowledging each; it returns the client sequence ids received, in order.
func ackEntries(t *testing.T, client, broker net.Conn, want int) []uint64 {
	t.Helper()
	got := make(chan []uint64, 1)
	go func() {
		var ids []uint64
		for len(ids) < want {
			cmd, _ := expect(t, client, pulsarpb.BaseCommand_SEND_RECEIPT)
			ids = append(ids, cmd.GetSendReceipt().GetSequenceId())
		}
		got <- ids
	}()
	for entry := uint64(0); ; entry++ {
		select {
		case ids := <-got:
			return ids
		default:
		}
		_ = broker.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		b, err := readFrameOrTimeout(broker)
		if err != nil {
			continue
		}
		f, _, err := wire.ReadFrame(b, wire.DefaultMaxMessageSize)
		if err != nil || f.Type() != pulsarpb.BaseCommand_SEND {
			continue
		}
		s, _ := wire.ParseSend(f)
		send(t, broker, wire.AppendSendReceiptFrame(nil, &wire.SendReceipt{ProducerID: s.ProducerID, SequenceID: s.SequenceID,
			HighestSequenceID: s.HighestSequenceID, HasMessageID: true, LedgerID: 1, EntryID: entry}))
	}
}

// readFrameOrTimeout reads one frame, or fails with the read deadline.
func readFrameOrTimeout(c net.Conn) ([]byte, error) {
	var hdr [4]byte
	if _, err := ioReadFull(c, hdr[:]); err != nil {
		return nil, err
	}
	n := int(hdr[0])<<24 | int(hdr[1])<<16 | int(hdr[2])<<8 | int(hdr[3])
	b := make([]byte, 4+n)
	copy(b, hdr[:])
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := ioReadFull(c, b[4:])
	return b, err
}

// Given a coalesce producer allowed 8 pending sends, and a broker that
// acknowledges nothing for a while,
// when the client sends 40 messages at once,
// then the connection stays open with the client's frames withheld, and
// once the broker acknowledges the entries every send gets its receipt, in
// order.
func TestBacklogWithholdsReadsInsteadOfDisconnecting(t *testing.T) {
	client, broker, logs := backlogProducer(t, 8)

	send(t, client, unbatchedSends(t, 40))

	logs.waitFor(t, "producer backlog high")
	_ = client.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := client.Read(make([]byte, 1)); err == nil || !isTimeout(err) {
		t.Fatalf("the client's connection did not stay open and silent: %v", err)
	}
	ids := ackEntries(t, client, broker, 40)
	for i, id := range ids {
		if id != uint64(i) {
			t.Fatalf("receipt %d is for sequence id %d", i, id)
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
