package wire_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/batch"
	"github.com/rebatchproxy/rebatchproxy/wire/compression"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// The golden files under testdata/golden are byte streams captured from
// real clients talking to a real broker (see internal/capture). These tests
// read every frame of every capture and check that package wire and its
// subpackages handle what real peers send.

type goldenManifest struct {
	Client        string `json:"client"`
	ClientVersion string `json:"client_version"`
	// BrokerEntryMetadata: the broker put the 0x0e02 block in MESSAGE frames.
	BrokerEntryMetadata bool `json:"broker_entry_metadata"`
	Scenario            struct {
		Name        string `json:"name"`
		Count       int    `json:"count"`
		Batching    bool   `json:"batching"`
		Compression string `json:"compression"`
		Keys        bool   `json:"keys"`
		OrderingKey bool   `json:"ordering_key"`
		Properties  bool   `json:"properties"`
		Chunking    bool   `json:"chunking"`
		Size        int    `json:"size"`
	} `json:"scenario"`
	Connections []struct {
		C2B       string         `json:"c2b"`
		B2C       string         `json:"b2c"`
		C2BFrames map[string]int `json:"c2b_frames"`
		B2CFrames map[string]int `json:"b2c_frames"`
	} `json:"connections"`
}

// message is one application message found in a capture.
type message struct {
	payload     []byte
	key         string
	orderingKey []byte
	props       map[string]string
}

// sideReport accumulates what one direction of a capture contained.
type sideReport struct {
	messages     []message
	compressions map[pulsarpb.CompressionType]int
	batches      int
	largestBatch int
	chunks       map[string][][]byte // uuid -> chunk payloads in order
}

func TestGoldenCaptures(t *testing.T) {
	manifests, _ := filepath.Glob(filepath.Join("testdata", "golden", "*", "*", "manifest.json"))
	if len(manifests) == 0 {
		t.Fatal("no golden captures found under testdata/golden")
	}
	for _, path := range manifests {
		dir := filepath.Dir(path)
		name := strings.TrimPrefix(dir, filepath.Join("testdata", "golden")+string(filepath.Separator))
		t.Run(name, func(t *testing.T) {
			var m goldenManifest
			raw, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(raw, &m); err != nil {
				t.Fatal(err)
			}
			if len(m.Connections) == 0 {
				t.Fatal("manifest lists no connection")
			}
			sent := &sideReport{compressions: map[pulsarpb.CompressionType]int{}, chunks: map[string][][]byte{}}
			delivered := &sideReport{compressions: map[pulsarpb.CompressionType]int{}, chunks: map[string][][]byte{}}
			for _, c := range m.Connections {
				checkStream(t, filepath.Join(dir, c.C2B), c.C2BFrames, false, sent)
				checkStream(t, filepath.Join(dir, c.B2C), c.B2CFrames, m.BrokerEntryMetadata, delivered)
			}
			checkScenario(t, &m, "sent", sent)
			checkScenario(t, &m, "delivered", delivered)
		})
	}
}

// checkStream reads one captured byte stream frame by frame.
func checkStream(t *testing.T, path string, wantCounts map[string]int, wantBEM bool, rep *sideReport) {
	t.Helper()
	stream, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	var cmd pulsarpb.BaseCommand
	var md pulsarpb.MessageMetadata
	for off := 0; off < len(stream); {
		f, n, err := wire.ReadFrame(stream[off:], 0)
		if err != nil {
			t.Fatalf("%s at byte %d: %v", filepath.Base(path), off, err)
		}
		off += n
		counts[f.Type().String()]++
		if err := wire.DecodeCommand(f, &cmd); err != nil {
			t.Fatalf("%s: %v", f.Type(), err)
		}
		if cmd.Type == nil || cmd.GetType() != f.Type() {
			t.Fatalf("peeked %v, decoded %v", f.Type(), cmd.Type)
		}
		if !f.HasPayload() {
			// Decode -> encode of an untouched command is byte-identical.
			again, err := wire.AppendCommandFrame(nil, &cmd)
			if err != nil || !bytes.Equal(again, f.Bytes()) {
				t.Fatalf("%v re-encodes differently:\n got %x\nwant %x", f.Type(), again, f.Bytes())
			}
			checkHotCommands(t, f, &cmd)
			continue
		}
		if err := f.VerifyChecksum(); err != nil {
			t.Fatalf("%v: %v", f.Type(), err)
		}
		if f.HasBrokerEntryMetadata() != (wantBEM && f.Type() == pulsarpb.BaseCommand_MESSAGE) {
			t.Fatalf("%v: broker entry metadata present %v, broker configured %v", f.Type(), f.HasBrokerEntryMetadata(), wantBEM)
		}
		if f.HasBrokerEntryMetadata() {
			var bem pulsarpb.BrokerEntryMetadata
			if err := proto.Unmarshal(f.BrokerEntryMetadata(), &bem); err != nil || bem.GetBrokerTimestamp() == 0 || bem.Index == nil {
				t.Fatalf("broker entry metadata %v: %v", &bem, err)
			}
		}
		if err := wire.DecodeMetadata(f.Metadata(), &md); err != nil {
			t.Fatal(err)
		}
		// Re-encode command and metadata; the frame must come out identical.
		cmdBytes, err := proto.MarshalOptions{AllowPartial: true}.Marshal(&cmd)
		if err != nil {
			t.Fatal(err)
		}
		mdBytes, err := wire.AppendMetadata(nil, &md)
		if err != nil {
			t.Fatal(err)
		}
		if again := wire.AppendRawPayloadFrame(nil, cmdBytes, f.BrokerEntryMetadata(), mdBytes, f.Payload()); !bytes.Equal(again, f.Bytes()) {
			t.Fatalf("%v frame re-encodes differently:\n got %x\nwant %x", f.Type(), again, f.Bytes())
		}
		checkHotCommands(t, f, &cmd)
		collectMessages(t, f, &cmd, &md, rep)
	}
	for typ, want := range wantCounts {
		if counts[typ] != want {
			t.Errorf("%s: %d %s frames, manifest says %d", filepath.Base(path), counts[typ], typ, want)
		}
	}
	if len(counts) != len(wantCounts) {
		t.Errorf("%s: frame types %v, manifest %v", filepath.Base(path), counts, wantCounts)
	}
}

// checkHotCommands compares the allocation-free parsers with the full decode.
func checkHotCommands(t *testing.T, f wire.Frame, cmd *pulsarpb.BaseCommand) {
	t.Helper()
	switch f.Type() {
	case pulsarpb.BaseCommand_SEND:
		s, err := wire.ParseSend(f)
		g := cmd.GetSend()
		if err != nil || s.ProducerID != g.GetProducerId() || s.SequenceID != g.GetSequenceId() ||
			s.NumMessages != g.GetNumMessages() && !(s.NumMessages == 0 && g.NumMessages == nil) ||
			s.HighestSequenceID != g.GetHighestSequenceId() || s.IsChunk != g.GetIsChunk() || s.Marker != g.GetMarker() {
			t.Fatalf("ParseSend %+v vs %v (%v)", s, g, err)
		}
	case pulsarpb.BaseCommand_SEND_RECEIPT:
		r, err := wire.ParseSendReceipt(f)
		g := cmd.GetSendReceipt()
		if err != nil || r.ProducerID != g.GetProducerId() || r.SequenceID != g.GetSequenceId() ||
			r.HighestSequenceID != g.GetHighestSequenceId() || r.HasMessageID != (g.MessageId != nil) ||
			r.LedgerID != g.GetMessageId().GetLedgerId() || r.EntryID != g.GetMessageId().GetEntryId() {
			t.Fatalf("ParseSendReceipt %+v vs %v (%v)", r, g, err)
		}
	}
}

// collectMessages decompresses and splits a SEND or MESSAGE payload.
func collectMessages(t *testing.T, f wire.Frame, cmd *pulsarpb.BaseCommand, md *pulsarpb.MessageMetadata, rep *sideReport) {
	t.Helper()
	rep.compressions[md.GetCompression()]++
	if md.GetUuid() != "" && md.GetNumChunksFromMsg() > 1 {
		if f.Type() == pulsarpb.BaseCommand_SEND && !cmd.GetSend().GetIsChunk() {
			t.Fatal("chunk without CommandSend.is_chunk")
		}
		if int(md.GetChunkId()) != len(rep.chunks[md.GetUuid()]) {
			t.Fatalf("chunk %d of %s out of order", md.GetChunkId(), md.GetUuid())
		}
		rep.chunks[md.GetUuid()] = append(rep.chunks[md.GetUuid()], bytes.Clone(f.Payload()))
		if int(md.GetChunkId()) == int(md.GetNumChunksFromMsg())-1 {
			whole := bytes.Join(rep.chunks[md.GetUuid()], nil)
			if len(whole) != int(md.GetTotalChunkMsgSize()) {
				t.Fatalf("chunks add up to %d bytes, total_chunk_msg_size %d", len(whole), md.GetTotalChunkMsgSize())
			}
			rep.messages = append(rep.messages, single(t, md, whole))
		}
		return
	}
	if md.NumMessagesInBatch == nil {
		rep.messages = append(rep.messages, single(t, md, f.Payload()))
		return
	}
	rep.batches++
	plain := decompress(t, md, f.Payload())
	n := int(md.GetNumMessagesInBatch())
	rep.largestBatch = max(rep.largestBatch, n)
	msgs, err := batch.Split(nil, plain, n)
	if err != nil {
		t.Fatalf("split %d messages: %v", n, err)
	}
	if !bytes.Equal(batch.Assemble(nil, msgs), plain) {
		t.Fatal("assemble(split(batch)) differs")
	}
	if f.Type() == pulsarpb.BaseCommand_SEND && cmd.GetSend().GetNumMessages() != int32(n) {
		t.Errorf("CommandSend.num_messages %d, batch holds %d", cmd.GetSend().GetNumMessages(), n)
	}
	for _, bm := range msgs {
		meta, err := batch.ParseSingleMeta(bm.Metadata)
		if err != nil {
			t.Fatal(err)
		}
		var smm pulsarpb.SingleMessageMetadata
		if err := batch.DecodeSingleMeta(bm.Metadata, &smm); err != nil {
			t.Fatal(err)
		}
		again, err := proto.MarshalOptions{AllowPartial: true}.Marshal(&smm)
		if err != nil || !bytes.Equal(again, bm.Metadata) {
			t.Fatalf("SingleMessageMetadata re-encodes differently: %x vs %x", again, bm.Metadata)
		}
		if string(meta.PartitionKey) != smm.GetPartitionKey() || !bytes.Equal(meta.OrderingKey, smm.GetOrderingKey()) ||
			meta.NumProperties != len(smm.GetProperties()) || meta.EventTime != smm.GetEventTime() || meta.SequenceID != smm.GetSequenceId() {
			t.Fatalf("hand parser %+v disagrees with %v", meta, &smm)
		}
		props := map[string]string{}
		_ = meta.Properties(func(k, v []byte) bool { props[string(k)] = string(v); return true })
		rep.messages = append(rep.messages, message{payload: bm.Payload, key: smm.GetPartitionKey(), orderingKey: smm.GetOrderingKey(), props: props})
	}
}

func single(t *testing.T, md *pulsarpb.MessageMetadata, payload []byte) message {
	props := map[string]string{}
	for _, p := range md.GetProperties() {
		props[p.GetKey()] = p.GetValue()
	}
	return message{payload: decompress(t, md, payload), key: md.GetPartitionKey(), orderingKey: md.GetOrderingKey(), props: props}
}

// decompress runs the client's compressed bytes through our decoder, then
// checks that our encoder's output decodes to the same bytes.
func decompress(t *testing.T, md *pulsarpb.MessageMetadata, payload []byte) []byte {
	t.Helper()
	c := md.GetCompression()
	if c == pulsarpb.CompressionType_NONE {
		return payload
	}
	plain, err := compression.Decompress(nil, c, payload, int(md.GetUncompressedSize()), 0)
	if err != nil {
		t.Fatalf("%v payload from a real client: %v", c, err)
	}
	ours, err := compression.Compress(nil, c, plain)
	if err != nil {
		t.Fatal(err)
	}
	back, err := compression.Decompress(nil, c, ours, len(plain), 0)
	if err != nil || !bytes.Equal(back, plain) {
		t.Fatalf("%v: our compression does not round-trip: %v", c, err)
	}
	return plain
}

// expectedPayload mirrors the drivers' payload convention: "msg-<i>"
// padded with dots to the scenario's size.
func expectedPayload(i, size int) []byte {
	s := fmt.Sprintf("msg-%d", i)
	if len(s) < size {
		s += strings.Repeat(".", size-len(s))
	}
	return []byte(s)
}

// droppedOrderingKey lists captures whose client loses the ordering key:
// pulsar-client-go v0.10.0 builds the MessageMetadata of an unbatched
// message without ordering_key (producer_partition.go sets it only on the
// SingleMessageMetadata of batched ones). v0.8.1 is not affected because it
// always sends batch containers; v0.12.1 and later set it.
var droppedOrderingKey = map[string]bool{
	"go-v0.10.0/unbatched-keyed-props": true,
}

// checkScenario verifies that a capture holds what its scenario promises,
// so a capture that silently missed a feature fails here.
func checkScenario(t *testing.T, m *goldenManifest, side string, rep *sideReport) {
	t.Helper()
	s := m.Scenario
	if len(rep.messages) != s.Count {
		t.Fatalf("%s: %d messages, scenario produces %d", side, len(rep.messages), s.Count)
	}
	seen := map[int]bool{}
	for _, msg := range rep.messages {
		i := -1
		for j := 0; j < s.Count; j++ {
			if bytes.Equal(msg.payload, expectedPayload(j, s.Size)) {
				i = j
			}
		}
		if i < 0 || seen[i] {
			t.Fatalf("%s: unexpected or repeated payload %.40q", side, msg.payload)
		}
		seen[i] = true
		if s.Keys && msg.key != fmt.Sprintf("key-%d", i%8) {
			t.Errorf("%s: message %d key %q", side, i, msg.key)
		}
		if s.OrderingKey {
			want := fmt.Sprintf("key-%d", i%8)
			if droppedOrderingKey[m.Client+"-"+m.ClientVersion+"/"+s.Name] {
				want = "" // the observed client bug, checked so a fix shows up
			}
			if string(msg.orderingKey) != want {
				t.Errorf("%s: message %d ordering key %q, want %q", side, i, msg.orderingKey, want)
			}
		}
		if s.Properties && (msg.props["index"] != fmt.Sprint(i) || msg.props["region"] != fmt.Sprint(i%2)) {
			t.Errorf("%s: message %d properties %v", side, i, msg.props)
		}
	}
	if s.Batching && rep.batches == 0 {
		t.Errorf("%s: batching scenario without a batch entry", side)
	}
	// With batching off, pulsar-client-go v0.8.1 still sends batch
	// containers of one message each (captured); v0.12.1 and later, and
	// the Python client, send plain entries.
	if !s.Batching && rep.largestBatch > 1 {
		t.Errorf("%s: a %d-message batch in an unbatched scenario", side, rep.largestBatch)
	}
	if s.Chunking && len(rep.chunks) == 0 {
		t.Errorf("%s: chunking scenario without chunks", side)
	}
	if want := map[string]pulsarpb.CompressionType{
		"none": pulsarpb.CompressionType_NONE, "lz4": pulsarpb.CompressionType_LZ4, "zlib": pulsarpb.CompressionType_ZLIB,
		"zstd": pulsarpb.CompressionType_ZSTD, "snappy": pulsarpb.CompressionType_SNAPPY,
	}[s.Compression]; len(rep.compressions) != 1 || rep.compressions[want] == 0 {
		t.Errorf("%s: compressions %v, scenario uses %s", side, rep.compressions, s.Compression)
	}
}
