package proxy

import (
	"bytes"
	"testing"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// remakeSends is a producer path that consumes every SEND and writes one of its own in its
// place, with a sequence id of its own, as a re-batching engine does; the broker's receipts it
// answers with a receipt of its own towards the client.
type remakeSends struct{ forwardPath }

func (remakeSends) FromClient(f wire.Frame, out Outputs) (Verdict, error) {
	if f.Type() != pulsarpb.BaseCommand_SEND {
		return Forward, nil
	}
	s, err := wire.ParseSend(f)
	if err != nil {
		return Forward, err
	}
	s.SequenceID += 1000
	out.ToBroker(wire.AppendSendFrame(nil, &s, f.Metadata(), f.Payload()))
	return Consumed, nil
}

func (remakeSends) FromBroker(f wire.Frame, out Outputs) (Verdict, error) {
	if f.Type() != pulsarpb.BaseCommand_SEND_RECEIPT {
		return Forward, nil
	}
	r, err := wire.ParseSendReceipt(f)
	if err != nil {
		return Forward, err
	}
	r.SequenceID -= 1000
	out.ToClient(wire.AppendSendReceiptFrame(nil, &r))
	return Consumed, nil
}

func testSend(t *testing.T, seq uint64) []byte {
	t.Helper()
	md := &pulsarpb.MessageMetadata{}
	f, err := wire.AppendSendFrameMetadata(nil, &wire.Send{ProducerID: 1, SequenceID: seq}, md, []byte("m"))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// Contract 3, transparency, for frames the proxy makes (gather.go).
// Given an established connection whose producer path remakes every SEND and every receipt,
// when the client's SENDs and PINGs arrive in one read, and the broker's receipts in one read,
// then each side gets, in one write, exactly what it would have got frame by frame, in order:
// the remade SENDs where the client's were and the PINGs between them unchanged; the remade
// receipts; and the session keeps no buffer once the reads are handled.
func TestCoreFramesTheProxyMakesLeaveInTheReadsOneWrite(t *testing.T) {
	l := established(t, func(c *Config) { c.ProducerPaths = func(ConnInfo) ProducerPath { return remakeSends{} } })
	ping := wire.AppendPingFrame(nil)
	var fromClient, wantBroker, fromBroker, wantClient []byte
	for i := uint64(0); i < 8; i++ {
		fromClient = append(append(fromClient, testSend(t, i)...), ping...)
		remade, _ := wire.ParseSend(mustFrame(t, testSend(t, i)))
		remade.SequenceID += 1000
		f := mustFrame(t, testSend(t, i))
		wantBroker = append(append(wantBroker, wire.AppendSendFrame(nil, &remade, f.Metadata(), f.Payload())...), ping...)
		fromBroker = wire.AppendSendReceiptFrame(fromBroker, &wire.SendReceipt{ProducerID: 1, SequenceID: 1000 + i, HasMessageID: true, LedgerID: 3, EntryID: i})
		wantClient = wire.AppendSendReceiptFrame(wantClient, &wire.SendReceipt{ProducerID: 1, SequenceID: i, HasMessageID: true, LedgerID: 3, EntryID: i})
	}
	brokerWrites, clientWrites := l.broker.writes, l.client.writes

	l.feed(l.client, fromClient)
	l.feed(l.broker, fromBroker)

	if got := l.broker.take(); !bytes.Equal(got, wantBroker) {
		t.Errorf("the broker got %d bytes, want the remade SENDs and the PINGs in order (%d bytes)", len(got), len(wantBroker))
	}
	if n := l.broker.writes - brokerWrites; n != 1 {
		t.Errorf("the broker's bytes came in %d writes, want 1", n)
	}
	if got := l.client.take(); !bytes.Equal(got, wantClient) {
		t.Errorf("the client got %d bytes, want the remade receipts in order (%d bytes)", len(got), len(wantClient))
	}
	if n := l.client.writes - clientWrites; n != 1 {
		t.Errorf("the client's bytes came in %d writes, want 1", n)
	}
	if l.s.gather != nil {
		t.Error("the session kept a gather buffer after its reads were handled (contract 7: idle sessions hold none)")
	}
}

func mustFrame(t *testing.T, b []byte) wire.Frame {
	t.Helper()
	f, _, err := wire.ReadFrame(b, len(b))
	if err != nil {
		t.Fatal(err)
	}
	return f
}
