package wire

import (
	"bytes"
	"math/rand"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire/batch"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// The protobuf runtime is the oracle: ParseSendMetadata must read what a full decode reads, and
// AppendSingleMetadata must write what marshalling the moved fields writes (the rewriting path's
// former code, kept here as the specification).

// singleViaProto is the SingleMessageMetadata of a message sent alone, built with the
// protobuf runtime from a decoded MessageMetadata.
func singleViaProto(t testing.TB, md *pulsarpb.MessageMetadata, payloadSize int) []byte {
	t.Helper()
	smm := &pulsarpb.SingleMessageMetadata{
		Properties: md.Properties, PartitionKey: md.PartitionKey, PartitionKeyB64Encoded: md.PartitionKeyB64Encoded,
		OrderingKey: md.OrderingKey, EventTime: md.EventTime, NullValue: md.NullValue, NullPartitionKey: md.NullPartitionKey,
		SequenceId: proto.Uint64(md.GetSequenceId()), PayloadSize: proto.Int32(int32(payloadSize)),
	}
	b, err := proto.MarshalOptions{AllowPartial: true, Deterministic: true}.Marshal(smm)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// special is what the rewriting path used to judge from a decoded MessageMetadata.
func special(md *pulsarpb.MessageMetadata) bool {
	_, known := pulsarpb.CompressionType_name[int32(md.GetCompression())]
	return !known || md.ChunkId != nil || md.NumChunksFromMsg != nil || md.Uuid != nil ||
		len(md.EncryptionKeys) > 0 || md.EncryptionAlgo != nil || md.EncryptionParam != nil ||
		md.DeliverAtTime != nil || md.MarkerType != nil || md.ReplicatedFrom != nil || len(md.ReplicateTo) > 0 ||
		md.TxnidLeastBits != nil || md.TxnidMostBits != nil || md.TotalChunkMsgSize != nil || md.SchemaId != nil ||
		md.EntryHashMin != nil || md.EntryHashMax != nil || len(md.ProtoReflect().GetUnknown()) > 0
}

// agreeWithProto checks ParseSendMetadata and AppendSingleMetadata against the runtime for the
// encoded metadata b, which the runtime decodes: byte for byte, or, for metadata that is not
// in canonical form (a property with unknown fields, fields out of order: only fuzzed input),
// as the same message.
func agreeWithProto(t testing.TB, b []byte) { agree(t, b, true) }

func agree(t testing.TB, b []byte, exact bool) {
	t.Helper()
	var md pulsarpb.MessageMetadata
	if err := DecodeMetadata(b, &md); err != nil {
		t.Fatalf("oracle cannot decode: %v", err)
	}
	var m SendMetadata
	if err := ParseSendMetadata(b, &m); err != nil {
		t.Fatalf("ParseSendMetadata refuses what the runtime decodes: %v (%x)", err, b)
	}
	if m.SequenceID != md.GetSequenceId() || m.PublishTime != md.GetPublishTime() || m.HasPublishTime != (md.PublishTime != nil) ||
		m.UncompressedSize != md.GetUncompressedSize() || m.Batched != (md.NumMessagesInBatch != nil) ||
		(m.Batched && m.NumMessagesInBatch != md.GetNumMessagesInBatch()) ||
		m.HasSchemaVersion != (md.SchemaVersion != nil) || !bytes.Equal(m.SchemaVersion, md.SchemaVersion) {
		t.Fatalf("ParseSendMetadata %+v disagrees with the runtime's %v", m, &md)
	}
	// A codec the runtime does not know it keeps as an unknown field (reading NONE); the raw
	// scan marks the send special instead, so it is never merged.
	if !m.Special && m.Compression != md.GetCompression() {
		t.Fatalf("compression %v, runtime %v", m.Compression, md.GetCompression())
	}
	if _, known := pulsarpb.CompressionType_name[int32(m.Compression)]; m.Special != special(&md) && known {
		t.Fatalf("special %v, runtime says %v: %v", m.Special, special(&md), &md)
	}
	for _, size := range []int{0, 100, 1 << 20} {
		got, want := m.AppendSingleMetadata(nil, size), singleViaProto(t, &md, size)
		if !exact && !bytes.Equal(got, want) {
			var g, w pulsarpb.SingleMessageMetadata
			if u := (proto.UnmarshalOptions{AllowPartial: true}); u.Unmarshal(got, &g) == nil && u.Unmarshal(want, &w) == nil && proto.Equal(&g, &w) {
				continue
			}
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("AppendSingleMetadata\n got %x\nwant %x\n(from %v)", got, want, &md)
		}
		parsed, err := batch.ParseSingleMeta(got)
		if err != nil {
			t.Fatalf("ParseSingleMeta refuses what AppendSingleMetadata wrote: %v (%x)", err, got)
		}
		// Filled over another message's view, as the engine reuses its message list: every
		// field must be written, none left from before.
		known := staleSingleMeta
		if m.FillSingleMeta(&known, got, size); !sameSingleMeta(known, parsed) {
			t.Fatalf("SingleMeta\n got %+v\nwant %+v (parsed from %x)", known, parsed, got)
		}
	}
}

// staleSingleMeta is a message view with every field set, for FillSingleMeta to write over.
var staleSingleMeta = func() batch.SingleMeta {
	raw := []byte{0x0a, 0x06, 0x0a, 0x01, 'k', 0x12, 0x01, 'v', 0x12, 0x02, 'p', 'k', 0x18, 0x05, 0x20, 0x01, 0x28, 0x07,
		0x30, 0x01, 0x3a, 0x02, 'o', 'k', 0x40, 0x09, 0x48, 0x01, 0x50, 0x01}
	m, err := batch.ParseSingleMeta(raw)
	if err != nil {
		panic(err)
	}
	return m
}()

// sameSingleMeta compares two parsed SingleMessageMetadata field by field (a present empty
// key may be nil in one and empty in the other: the flags say it is present).
func sameSingleMeta(a, b batch.SingleMeta) bool {
	return a.PayloadSize == b.PayloadSize && a.HasPartitionKey == b.HasPartitionKey && bytes.Equal(a.PartitionKey, b.PartitionKey) &&
		a.PartitionKeyB64Encoded == b.PartitionKeyB64Encoded && a.HasOrderingKey == b.HasOrderingKey && bytes.Equal(a.OrderingKey, b.OrderingKey) &&
		a.EventTime == b.EventTime && a.SequenceID == b.SequenceID && a.HasSequenceID == b.HasSequenceID && a.CompactedOut == b.CompactedOut &&
		a.NullValue == b.NullValue && a.NullPartitionKey == b.NullPartitionKey && a.NumProperties == b.NumProperties &&
		bytes.Equal(a.PropertiesRaw(), b.PropertiesRaw())
}

func TestSendMetadataAgreesWithTheRuntime(t *testing.T) {
	for _, tc := range []struct {
		name string
		md   *pulsarpb.MessageMetadata
	}{
		{"minimal", &pulsarpb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(7), PublishTime: proto.Uint64(1)}},
		{"empty", &pulsarpb.MessageMetadata{}},
		{"keyed with properties", &pulsarpb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(1 << 40), PublishTime: proto.Uint64(1700000000000),
			Properties:   []*pulsarpb.KeyValue{{Key: proto.String("a"), Value: proto.String("1")}, {Key: proto.String("a"), Value: proto.String("")}},
			PartitionKey: proto.String("k"), PartitionKeyB64Encoded: proto.Bool(false), OrderingKey: []byte{}, EventTime: proto.Uint64(5),
			NullValue: proto.Bool(true), NullPartitionKey: proto.Bool(false)}},
		{"batch", &pulsarpb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(3), PublishTime: proto.Uint64(2),
			NumMessagesInBatch: proto.Int32(10), Compression: pulsarpb.CompressionType_ZSTD.Enum(), UncompressedSize: proto.Uint32(1000),
			SchemaVersion: []byte{}, HighestSequenceId: proto.Uint64(12)}},
		{"chunk", &pulsarpb.MessageMetadata{ChunkId: proto.Int32(0), NumChunksFromMsg: proto.Int32(3), Uuid: proto.String("u")}},
		{"delayed", &pulsarpb.MessageMetadata{DeliverAtTime: proto.Int64(-1)}},
		{"replicated", &pulsarpb.MessageMetadata{ReplicateTo: []string{"c"}}},
		{"encrypted", &pulsarpb.MessageMetadata{EncryptionParam: []byte{}}},
		{"transaction", &pulsarpb.MessageMetadata{TxnidMostBits: proto.Uint64(0)}},
		{"negative batch count", &pulsarpb.MessageMetadata{NumMessagesInBatch: proto.Int32(-1)}},
		{"schema id", &pulsarpb.MessageMetadata{SchemaId: []byte{1}}},
		{"hash range set by the client", &pulsarpb.MessageMetadata{EntryHashMin: proto.Uint32(0), EntryHashMax: proto.Uint32(99)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := proto.MarshalOptions{AllowPartial: true}.Marshal(tc.md)
			if err != nil {
				t.Fatal(err)
			}
			agreeWithProto(t, b)
		})
	}
}

// TestSendMetadataAgreesOnEveryCapturedFrame runs the comparison on the metadata of every
// payload frame the golden captures hold: what real clients and the broker wrote.
func TestSendMetadataAgreesOnEveryCapturedFrame(t *testing.T) {
	mds := goldenMetadata(t)
	for _, md := range mds {
		agreeWithProto(t, md)
	}
	if len(mds) < 100 {
		t.Fatalf("only %d captured payload frames: the golden captures are missing", len(mds))
	}
	t.Logf("%d captured metadata agree", len(mds))
}

// TestSendMetadataLastOccurrenceAndWrongWireTypes: fields repeated on the wire (the last one
// counts) and known fields with the wrong wire type (unknown to the runtime) read alike.
func TestSendMetadataLastOccurrenceAndWrongWireTypes(t *testing.T) {
	for _, b := range [][]byte{
		{0x10, 0x01, 0x10, 0x02},             // sequence_id 1, then 2
		{0x32, 0x01, 'a', 0x32, 0x01, 'b'},   // partition_key "a", then "b"
		{0x12, 0x01, 'x', 0x10, 0x05},        // sequence_id as bytes (unknown), then as varint
		{0x30, 0x07},                         // partition_key as a varint: unknown
		{0x40, 0x63},                         // compression 99: a codec nobody knows
		{0xc8, 0x01, 0x01, 0xc8, 0x01, 0x00}, // null_value true, then false
	} {
		agreeWithProto(t, b)
	}
}

// Given metadata with a field this build does not know (a newer client's), of any wire type,
// when it is scanned,
// then the send is special: an entry the proxy builds would not carry the field, so the
// message travels alone and unchanged.
func TestSendMetadataUnknownFieldsMakeTheSendSpecial(t *testing.T) {
	for _, b := range [][]byte{
		{0x10, 0x01, 0xb0, 0x02, 0x05},       // field 38, varint
		{0x10, 0x01, 0xba, 0x02, 0x01, 'x'},  // field 39, bytes
		{0x10, 0x01, 0xc5, 0x02, 1, 2, 3, 4}, // field 40, fixed32
		{0x10, 0x01, 0x50, 0x01},             // field 10 (never assigned), varint
		{0x10, 0x01, 0xe0, 0x01, 0x10},       // total_chunk_msg_size without a chunk id
	} {
		var m SendMetadata
		if err := ParseSendMetadata(b, &m); err != nil {
			t.Fatalf("%x: %v", b, err)
		}
		if !m.Special {
			t.Errorf("%x: not special", b)
		}
		agreeWithProto(t, b)
	}
}

func TestSendMetadataMalformed(t *testing.T) {
	for _, b := range [][]byte{
		{0x0a, 0x05, 'a'},        // truncated producer_name
		{0x22, 0x02, 0x0a, 0x05}, // a property whose key is truncated
		{0x00},                   // field number 0
	} {
		var m SendMetadata
		if err := ParseSendMetadata(b, &m); err != ErrMalformedMetadata {
			t.Errorf("%x: %v, want ErrMalformedMetadata", b, err)
		}
		var md pulsarpb.MessageMetadata
		if DecodeMetadata(b, &md) == nil {
			t.Errorf("%x: the runtime decodes it; the spec case is wrong", b)
		}
	}
}

// TestSendMetadataRandomAgreesWithTheRuntime draws metadata with every field the scan reads,
// present or not, and compares.
func TestSendMetadataRandomAgreesWithTheRuntime(t *testing.T) {
	rnd := rand.New(rand.NewSource(1))
	for i := 0; i < 3000; i++ {
		b, err := proto.MarshalOptions{AllowPartial: true}.Marshal(randomMetadata(rnd))
		if err != nil {
			t.Fatal(err)
		}
		agreeWithProto(t, b)
	}
}

func randomMetadata(rnd *rand.Rand) *pulsarpb.MessageMetadata {
	md := &pulsarpb.MessageMetadata{}
	maybe := func() bool { return rnd.Intn(3) == 0 }
	str := func() string { return string([]byte{byte(rnd.Intn(256)), 'k'}[:rnd.Intn(3)]) }
	byt := func() []byte { return []byte(str()) }
	if maybe() {
		md.ProducerName = proto.String(str())
	}
	if maybe() {
		md.SequenceId = proto.Uint64(rnd.Uint64())
	}
	if maybe() {
		md.PublishTime = proto.Uint64(rnd.Uint64() >> rnd.Intn(64))
	}
	for n := rnd.Intn(3); n > 0; n-- {
		md.Properties = append(md.Properties, &pulsarpb.KeyValue{Key: proto.String(str()), Value: proto.String(str())})
	}
	if maybe() {
		md.PartitionKey = proto.String(str())
	}
	if maybe() {
		md.PartitionKeyB64Encoded = proto.Bool(rnd.Intn(2) == 0)
	}
	if maybe() {
		md.OrderingKey = byt()
	}
	if maybe() {
		md.EventTime = proto.Uint64(rnd.Uint64() >> rnd.Intn(64))
	}
	if maybe() {
		md.NullValue = proto.Bool(rnd.Intn(2) == 0)
	}
	if maybe() {
		md.NullPartitionKey = proto.Bool(rnd.Intn(2) == 0)
	}
	if maybe() {
		md.NumMessagesInBatch = proto.Int32(rnd.Int31() - 1<<30)
	}
	if maybe() {
		md.Compression = pulsarpb.CompressionType(rnd.Intn(5)).Enum()
	}
	if maybe() {
		md.UncompressedSize = proto.Uint32(rnd.Uint32())
	}
	if maybe() {
		md.SchemaVersion = byt()
	}
	if maybe() {
		md.HighestSequenceId = proto.Uint64(rnd.Uint64())
	}
	if rnd.Intn(10) == 0 {
		md.ChunkId = proto.Int32(1)
	}
	if rnd.Intn(10) == 0 {
		md.ReplicatedFrom = proto.String("c")
	}
	if rnd.Intn(10) == 0 {
		md.MarkerType = proto.Int32(1)
	}
	return md
}

// FuzzSendMetadata: for any bytes, the scan refuses exactly what the runtime cannot decode
// (with a well-formed exception: see below), and agrees with it on what it reads.
func FuzzSendMetadata(f *testing.F) {
	rnd := rand.New(rand.NewSource(2))
	for i := 0; i < 20; i++ {
		b, _ := proto.MarshalOptions{AllowPartial: true}.Marshal(randomMetadata(rnd))
		f.Add(b)
	}
	for _, md := range goldenMetadata(f) {
		f.Add(md)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var md pulsarpb.MessageMetadata
		runtimeErr := DecodeMetadata(in, &md)
		var m SendMetadata
		scanErr := ParseSendMetadata(in, &m)
		switch {
		case runtimeErr == nil && scanErr != nil:
			t.Fatalf("the scan refuses what the runtime decodes: %x", in)
		case runtimeErr != nil && scanErr == nil && !m.Special:
			// The runtime also checks sub-messages the scan does not read (encryption keys:
			// those make the send special, so it travels unchanged, for the broker to judge).
			t.Fatalf("the scan accepts what the runtime refuses, as a mergeable send: %x (%v)", in, runtimeErr)
		case runtimeErr == nil:
			agree(t, in, false)
		}
	})
}
