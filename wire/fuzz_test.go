package wire

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire/internal/pbscan"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

func fuzzSeedFrames() [][]byte {
	md := []byte{0x0a, 0x01, 'p', 0x10, 0x07, 0x18, 0x09}
	return [][]byte{
		AppendPingFrame(nil),
		AppendSendFrame(nil, &Send{ProducerID: 1, SequenceID: 2, NumMessages: 3, IsChunk: true}, md, []byte("payload")),
		AppendSendReceiptFrame(nil, &SendReceipt{ProducerID: 1, SequenceID: 2, HasMessageID: true, LedgerID: 3, EntryID: 4}),
		AppendRawPayloadFrame(nil, []byte{0x08, 0x09, 0x4a, 0x08, 0x08, 0x01, 0x12, 0x04, 0x08, 0x01, 0x10, 0x02}, []byte{0x08, 0x01}, md, []byte("m")),
		rawFrame(sendCmd, be32(uint32(len(md))), md),
	}
}

// FuzzFrameReader reads arbitrary streams frame by frame. It must never
// panic or report a frame outside the buffer, and the peeked type must
// agree with the generated decoder whenever that decoder accepts the
// command.
func FuzzFrameReader(f *testing.F) {
	seeds := fuzzSeedFrames()
	for _, s := range seeds {
		f.Add(s, 0)
	}
	f.Add(bytes.Join(seeds, nil), 64)
	for _, stream := range goldenStreams(f) {
		f.Add(stream, 0)
	}
	f.Fuzz(func(t *testing.T, buf []byte, max int) {
		for len(buf) > 0 {
			fr, n, err := ReadFrame(buf, max)
			if n < 0 || n > len(buf) {
				t.Fatalf("n = %d of %d", n, len(buf))
			}
			if err != nil {
				if errors.Is(err, ErrCorruptFrame) && n > 0 {
					buf = buf[n:]
					continue
				}
				if n != 0 {
					t.Fatalf("n = %d with %v", n, err)
				}
				return
			}
			if fr.Len() != n || fr.Len() > MaxFrameLen(max) {
				t.Fatalf("frame length %d, n %d", fr.Len(), n)
			}
			_ = fr.Command()
			_ = fr.HeadersAndPayload()
			_ = fr.BrokerEntryMetadata()
			_ = fr.Checksum()
			if fr.HasPayload() {
				if got := len(fr.Metadata()) + len(fr.Payload()); fr.MetadataOffset()+got != fr.Len() {
					t.Fatalf("metadata+payload do not end the frame")
				}
				_ = fr.VerifyChecksum()
			}
			_, _ = ParseSend(fr)
			_, _ = ParseSendReceipt(fr)
			// The sub-command found on the type's walk is the one a decoder keeps.
			sub, subOK := fr.subCommand()
			want, found, ok := pbscan.LastBytes(fr.Command(), uint64(fr.Type()))
			if subOK != (ok && found) || !bytes.Equal(sub, want) {
				t.Fatalf("sub-command %x (%v), LastBytes %x (%v %v)", sub, subOK, want, found, ok)
			}
			var cmd pulsarpb.BaseCommand
			if DecodeCommand(fr, &cmd) == nil && cmd.Type != nil && cmd.GetType() != fr.Type() {
				t.Fatalf("peeked %v, decoded %v", fr.Type(), cmd.GetType())
			}
			buf = buf[n:]
		}
	})
}

// FuzzMetadataDecode decodes arbitrary metadata. Whatever decodes must
// re-encode to bytes that decode to an equal message and re-encode
// identically, and read back from a SEND frame built around it.
func FuzzMetadataDecode(f *testing.F) {
	full := &pulsarpb.MessageMetadata{
		ProducerName: proto.String("p"), SequenceId: proto.Uint64(1), PublishTime: proto.Uint64(2),
		Properties:   []*pulsarpb.KeyValue{{Key: proto.String("k"), Value: proto.String("v")}},
		PartitionKey: proto.String("key"), NumMessagesInBatch: proto.Int32(3), OrderingKey: []byte{1},
		EntryHashMin: proto.Uint32(1), EntryHashMax: proto.Uint32(2), CompactedBatchIndexes: []int32{1, 2},
	}
	b, _ := proto.Marshal(full)
	f.Add(b)
	f.Add([]byte{})
	f.Add([]byte{0xc0, 0x02, 0x01}) // unknown field 40
	// Every distinct metadata real clients and the broker produced.
	for _, md := range goldenMetadata(f) {
		f.Add(md)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var md pulsarpb.MessageMetadata
		if DecodeMetadata(in, &md) != nil {
			return
		}
		enc, err := AppendMetadata(nil, &md)
		if err != nil {
			t.Fatal(err)
		}
		var back pulsarpb.MessageMetadata
		if err := DecodeMetadata(enc, &back); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(&md, &back) {
			t.Fatal("decode(encode(md)) != md")
		}
		enc2, _ := AppendMetadata(nil, &back)
		if !bytes.Equal(enc, enc2) {
			t.Fatal("encoding not stable")
		}
		frame := AppendSendFrame(nil, &Send{ProducerID: 1}, in, []byte("pl"))
		fr, _, err := ReadFrame(frame, 0)
		if err != nil {
			// Metadata beyond the frame limit, say; nothing to restamp.
			return
		}
		if !bytes.Equal(fr.Metadata(), in) || string(fr.Payload()) != "pl" || fr.VerifyChecksum() != nil {
			t.Fatal("a SEND frame built around the metadata does not read back")
		}
	})
}

// goldenStreams returns the captured byte streams under testdata/golden
// (small enough to be fuzz seeds).
func goldenStreams(f testing.TB) [][]byte {
	paths, _ := filepath.Glob(filepath.Join("testdata", "golden", "*", "*", "*.bin"))
	var out [][]byte
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		if len(b) <= 64<<10 {
			out = append(out, b)
		}
	}
	return out
}

// goldenMetadata returns the MessageMetadata of every payload frame in the golden captures.
func goldenMetadata(tb testing.TB) [][]byte {
	var out [][]byte
	for _, stream := range goldenStreams(tb) {
		for len(stream) > 0 {
			fr, n, err := ReadFrame(stream, 0)
			if err != nil {
				break
			}
			if fr.HasPayload() {
				out = append(out, bytes.Clone(fr.Metadata()))
			}
			stream = stream[n:]
		}
	}
	return out
}

// FuzzReadHead checks the cut-through reader against the whole-frame
// reader: on any buffer it never panics; wherever ReadFrame reads a frame,
// ReadHead reads the same length and type from every prefix that holds the
// command, and asks for more bytes on every shorter prefix.
func FuzzReadHead(f *testing.F) {
	for _, s := range fuzzSeedFrames() {
		f.Add(s, 0)
	}
	for _, stream := range goldenStreams(f) {
		f.Add(stream, 0)
	}
	f.Fuzz(func(t *testing.T, buf []byte, max int) {
		h, err := ReadHead(buf, max)
		if err == nil && (h.Len < frameHeaderLen || len(h.Command) > h.Len) {
			t.Fatalf("head %+v", h)
		}
		fr, _, ferr := ReadFrame(buf, max)
		if ferr != nil {
			return
		}
		headEnd := frameHeaderLen + fr.CommandSize()
		for k := 0; k <= fr.Len(); k++ {
			h, err := ReadHead(buf[:k], max)
			switch {
			case k < headEnd && !errors.Is(err, ErrIncomplete):
				t.Fatalf("prefix %d of %d (head ends at %d): %v", k, fr.Len(), headEnd, err)
			case k >= headEnd && (err != nil || h.Len != fr.Len() || h.Type != fr.Type() || !bytes.Equal(h.Command, fr.Command())):
				t.Fatalf("prefix %d: head %+v, %v; frame len %d type %v", k, h, err, fr.Len(), fr.Type())
			}
		}
	})
}
