package wire

import (
	"bytes"
	"encoding/hex"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/encode")

// decodeFrame reads exactly one frame and fully decodes its command.
func decodeFrame(t *testing.T, b []byte) (Frame, *pulsarpb.BaseCommand) {
	t.Helper()
	f, n, err := ReadFrame(b, 0)
	if err != nil || n != len(b) {
		t.Fatalf("ReadFrame: n=%d of %d, %v", n, len(b), err)
	}
	var cmd pulsarpb.BaseCommand
	if err := DecodeCommand(f, &cmd); err != nil {
		t.Fatal(err)
	}
	if cmd.GetType() != f.Type() {
		t.Fatalf("peeked type %v, decoded %v", f.Type(), cmd.GetType())
	}
	if f.HasPayload() {
		if err := f.VerifyChecksum(); err != nil {
			t.Fatal(err)
		}
	}
	return f, &cmd
}

func TestSendRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		send Send
	}{
		{"minimal", Send{ProducerID: 0, SequenceID: 0}},
		{"batch", Send{ProducerID: 7, SequenceID: 1 << 40, NumMessages: 1000, HighestSequenceID: 1<<40 + 999}},
		{"chunk", Send{ProducerID: 1, SequenceID: 5, IsChunk: true}},
		{"txn marker", Send{ProducerID: 1, SequenceID: 5, HasTxnID: true, TxnIDLeastBits: 9, TxnIDMostBits: 1 << 63, Marker: true}},
		// The first transaction of coordinator 0: present although zero.
		{"transaction (0, 0)", Send{ProducerID: 1, SequenceID: 6, HasTxnID: true}},
		{"shadow message id", Send{ProducerID: 2, SequenceID: 3, MessageID: []byte{0x08, 0x01, 0x10, 0x02}}},
	}
	md := &pulsarpb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(1), PublishTime: proto.Uint64(2)}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := AppendSendFrameMetadata([]byte("prefix"), &tc.send, md, []byte("payload"))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(b, []byte("prefix")) {
				t.Fatal("dst prefix lost")
			}
			f, cmd := decodeFrame(t, b[len("prefix"):])
			got, err := ParseSend(f)
			if err != nil {
				t.Fatal(err)
			}
			if !sendEqual(got, tc.send) {
				t.Fatalf("ParseSend = %+v, want %+v", got, tc.send)
			}
			// The generated decoder must agree with the hand-written encoder.
			s := cmd.GetSend()
			if s.GetProducerId() != tc.send.ProducerID || s.GetSequenceId() != tc.send.SequenceID ||
				s.GetHighestSequenceId() != tc.send.HighestSequenceID || s.GetIsChunk() != tc.send.IsChunk ||
				s.GetMarker() != tc.send.Marker || s.GetTxnidMostBits() != tc.send.TxnIDMostBits ||
				s.GetTxnidLeastBits() != tc.send.TxnIDLeastBits || (s.TxnidLeastBits != nil && s.TxnidMostBits != nil) != tc.send.HasTxnID ||
				(tc.send.NumMessages != 0 && s.GetNumMessages() != tc.send.NumMessages) ||
				(tc.send.MessageID != nil) != (s.MessageId != nil) {
				t.Fatalf("decoded %v", s)
			}
			// And re-encoding the generated message yields the same bytes.
			again, err := AppendPayloadFrame(nil, cmd, md, []byte("payload"))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(again, b[len("prefix"):]) {
				t.Fatalf("generated encoding differs:\n%x\n%x", again, b[len("prefix"):])
			}
		})
	}
}

func sendEqual(a, b Send) bool {
	return a.ProducerID == b.ProducerID && a.SequenceID == b.SequenceID && a.NumMessages == b.NumMessages &&
		a.HasTxnID == b.HasTxnID && a.TxnIDLeastBits == b.TxnIDLeastBits && a.TxnIDMostBits == b.TxnIDMostBits &&
		a.HighestSequenceID == b.HighestSequenceID && a.IsChunk == b.IsChunk && a.Marker == b.Marker &&
		bytes.Equal(a.MessageID, b.MessageID)
}

func TestSendReceiptRoundTrip(t *testing.T) {
	tests := []SendReceipt{
		{ProducerID: 1, SequenceID: 2},
		{ProducerID: 1, SequenceID: 2, HasMessageID: true, LedgerID: 10, EntryID: 20, HighestSequenceID: 9},
		// A de-duplicated send is acknowledged with -1:-1.
		{ProducerID: 1, SequenceID: 2, HasMessageID: true, LedgerID: ^uint64(0), EntryID: ^uint64(0)},
	}
	for _, want := range tests {
		b := AppendSendReceiptFrame(nil, &want)
		f, cmd := decodeFrame(t, b)
		got, err := ParseSendReceipt(f)
		if err != nil || got != want {
			t.Fatalf("ParseSendReceipt = %+v, %v; want %+v", got, err, want)
		}
		r := cmd.GetSendReceipt()
		if r.GetProducerId() != want.ProducerID || r.GetSequenceId() != want.SequenceID ||
			r.GetHighestSequenceId() != want.HighestSequenceID || (r.MessageId != nil) != want.HasMessageID ||
			r.GetMessageId().GetLedgerId() != want.LedgerID || r.GetMessageId().GetEntryId() != want.EntryID {
			t.Fatalf("decoded %v", r)
		}
	}
}

func TestParseWrongType(t *testing.T) {
	f, _ := decodeFrame(t, AppendPingFrame(nil))
	if _, err := ParseSend(f); err != ErrMalformedCommand {
		t.Fatalf("ParseSend(PING) = %v", err)
	}
	if _, err := ParseSendReceipt(f); err != ErrMalformedCommand {
		t.Fatalf("ParseSendReceipt(PING) = %v", err)
	}
	// SEND type without the send sub-command.
	f, _, err := ReadFrame(rawFrame([]byte{0x08, 0x06}), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseSend(f); err != ErrMalformedCommand {
		t.Fatalf("ParseSend(no body) = %v", err)
	}
}

func TestSendErrorAndPing(t *testing.T) {
	_, cmd := decodeFrame(t, AppendSendErrorFrame(nil, 4, 5, pulsarpb.ServerError_ChecksumError, "Checksum failed on the broker"))
	e := cmd.GetSendError()
	if e.GetProducerId() != 4 || e.GetSequenceId() != 5 || e.GetError() != pulsarpb.ServerError_ChecksumError || e.GetMessage() != "Checksum failed on the broker" {
		t.Fatalf("decoded %v", e)
	}
	_, cmd = decodeFrame(t, AppendPingFrame(nil))
	if cmd.Ping == nil {
		t.Fatal("PING without ping sub-message")
	}
	_, cmd = decodeFrame(t, AppendPongFrame(nil))
	if cmd.Pong == nil {
		t.Fatal("PONG without pong sub-message")
	}
}

// Unknown fields (a newer peer's) survive decode and re-encode.
func TestCommandUnknownFieldsSurvive(t *testing.T) {
	cmd := &pulsarpb.BaseCommand{
		Type:    pulsarpb.BaseCommand_CONNECT.Enum(),
		Connect: &pulsarpb.CommandConnect{ClientVersion: proto.String("test"), ProtocolVersion: proto.Int32(21)},
	}
	inner, err := proto.Marshal(cmd.Connect)
	if err != nil {
		t.Fatal(err)
	}
	inner = protowire.AppendTag(inner, 99, protowire.BytesType)
	inner = protowire.AppendString(inner, "from the future")
	raw := protowire.AppendTag([]byte{0x08, 0x02}, 2, protowire.BytesType)
	raw = protowire.AppendBytes(raw, inner)
	raw = protowire.AppendTag(raw, 90, protowire.VarintType) // a command field we do not model
	raw = protowire.AppendVarint(raw, 1)
	frame := rawFrame(raw)

	f, decoded := decodeFrame(t, frame)
	if f.Type() != pulsarpb.BaseCommand_CONNECT || decoded.GetConnect().GetClientVersion() != "test" {
		t.Fatal("decode")
	}
	out, err := AppendCommandFrame(nil, decoded)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, frame) {
		t.Fatalf("re-encoded frame differs:\n%x\n%x", out, frame)
	}
}

// Required fields are not enforced in either direction.
func TestRequiredFieldsNotEnforced(t *testing.T) {
	cmd := &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_SEND.Enum(), Send: &pulsarpb.CommandSend{}}
	b, err := AppendCommandFrame(nil, cmd)
	if err != nil {
		t.Fatal(err)
	}
	decodeFrame(t, b)
	var md pulsarpb.MessageMetadata
	if err := DecodeMetadata(nil, &md); err != nil {
		t.Fatalf("empty metadata: %v", err)
	}
}

// TestEncoderGolden pins the exact bytes of the hand-written encoders. Run
// with -update after an intended change and review the diff.
func TestEncoderGolden(t *testing.T) {
	md := &pulsarpb.MessageMetadata{
		ProducerName: proto.String("standalone-0-1"), SequenceId: proto.Uint64(41), PublishTime: proto.Uint64(1700000000000),
		NumMessagesInBatch: proto.Int32(2), UncompressedSize: proto.Uint32(10),
	}
	send, err := AppendSendFrameMetadata(nil, &Send{ProducerID: 1, SequenceID: 41, NumMessages: 2, HighestSequenceID: 42}, md, []byte("0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string][]byte{
		"ping":         AppendPingFrame(nil),
		"pong":         AppendPongFrame(nil),
		"send":         send,
		"send_receipt": AppendSendReceiptFrame(nil, &SendReceipt{ProducerID: 1, SequenceID: 41, HighestSequenceID: 42, HasMessageID: true, LedgerID: 17, EntryID: 300}),
		"send_error":   AppendSendErrorFrame(nil, 1, 41, pulsarpb.ServerError_PersistenceError, "boom"),
	}
	for name, got := range cases {
		path := filepath.Join("testdata", "encode", name+".hex")
		if *update {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(hex.EncodeToString(got)+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%s: %v (run go test -run TestEncoderGolden -update)", name, err)
		}
		if hex.EncodeToString(got) != strings.TrimSpace(string(want)) {
			t.Errorf("%s:\n got %x\nwant %s", name, got, want)
		}
	}
}
