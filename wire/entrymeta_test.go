package wire

import (
	"bytes"
	"math/rand"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// entryViaProto is the outer metadata of m built with the protobuf runtime, as the rewriting
// path used to build it: the oracle for AppendEntryMetadata.
func entryViaProto(m *EntryMetadata) *pulsarpb.MessageMetadata {
	md := &pulsarpb.MessageMetadata{
		ProducerName: proto.String(m.ProducerName), SequenceId: proto.Uint64(m.SequenceID),
		HighestSequenceId: proto.Uint64(m.HighestSequenceID), NumMessagesInBatch: proto.Int32(m.NumMessagesInBatch),
		UncompressedSize: proto.Uint32(m.UncompressedSize),
	}
	if m.HasPublishTime {
		md.PublishTime = proto.Uint64(m.PublishTime)
	}
	for _, p := range m.Properties {
		md.Properties = append(md.Properties, &pulsarpb.KeyValue{Key: proto.String(string(p.Key)), Value: proto.String(string(p.Value))})
	}
	if m.HasPartitionKey {
		md.PartitionKey = proto.String(string(m.PartitionKey))
		if m.PartitionKeyB64Encoded {
			md.PartitionKeyB64Encoded = proto.Bool(true)
		}
	}
	if m.HasOrderingKey {
		md.OrderingKey = append([]byte{}, m.OrderingKey...)
	}
	if m.Compression != pulsarpb.CompressionType_NONE {
		md.Compression = m.Compression.Enum()
	}
	if m.HasSchemaVersion {
		md.SchemaVersion = append([]byte{}, m.SchemaVersion...)
	}
	if m.HasEntryHashRange {
		md.EntryHashMin, md.EntryHashMax = proto.Uint32(m.EntryHashMin), proto.Uint32(m.EntryHashMax)
	}
	return md
}

func TestAppendEntryMetadataIsWhatTheRuntimeWrites(t *testing.T) {
	rnd := rand.New(rand.NewSource(3))
	byt := func() []byte { return bytes.Repeat([]byte{byte(rnd.Intn(256))}, rnd.Intn(200)) }
	for i := 0; i < 5000; i++ {
		m := &EntryMetadata{
			ProducerName: string(byt()), SequenceID: rnd.Uint64() >> rnd.Intn(64), HighestSequenceID: rnd.Uint64() >> rnd.Intn(64),
			PublishTime: rnd.Uint64() >> rnd.Intn(64), HasPublishTime: rnd.Intn(2) == 0,
			NumMessagesInBatch: rnd.Int31n(5000), UncompressedSize: rnd.Uint32(),
			Compression:       pulsarpb.CompressionType(rnd.Intn(5)),
			HasEntryHashRange: rnd.Intn(2) == 0, EntryHashMin: rnd.Uint32() >> 16, EntryHashMax: rnd.Uint32() >> 16,
		}
		for n := rnd.Intn(4); n > 0; n-- {
			m.Properties = append(m.Properties, Property{Key: byt(), Value: byt()})
		}
		switch rnd.Intn(3) {
		case 0:
			m.PartitionKey, m.HasPartitionKey, m.PartitionKeyB64Encoded = byt(), true, rnd.Intn(2) == 0
		case 1:
			m.OrderingKey, m.HasOrderingKey = byt(), true
		}
		if rnd.Intn(2) == 0 {
			m.SchemaVersion, m.HasSchemaVersion = byt(), true
		}
		want, err := proto.MarshalOptions{Deterministic: true, AllowPartial: true}.Marshal(entryViaProto(m))
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendEntryMetadata(nil, m); !bytes.Equal(got, want) {
			t.Fatalf("AppendEntryMetadata(%+v)\n got %x\nwant %x", m, got, want)
		}
		payload := byt()
		frame := AppendEntrySendFrame(nil, &Send{ProducerID: 3, SequenceID: m.SequenceID, NumMessages: m.NumMessagesInBatch}, m, payload)
		viaRuntime, err := AppendSendFrameMetadata(nil, &Send{ProducerID: 3, SequenceID: m.SequenceID, NumMessages: m.NumMessagesInBatch}, entryViaProto(m), payload)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(frame, viaRuntime) {
			t.Fatalf("AppendEntrySendFrame differs from the runtime-built frame\n got %x\nwant %x", frame, viaRuntime)
		}
	}
}

func TestEntryMetadataPathDoesNotAllocate(t *testing.T) {
	m := &EntryMetadata{ProducerName: "p-0", SequenceID: 5, HighestSequenceID: 9, HasPublishTime: true, PublishTime: 1700000000000,
		NumMessagesInBatch: 5, Properties: []Property{{[]byte("region"), []byte("eu")}}, OrderingKey: []byte("k"), HasOrderingKey: true,
		HasEntryHashRange: true, EntryHashMin: 1, EntryHashMax: 2}
	md := &pulsarpb.MessageMetadata{ProducerName: proto.String("c"), SequenceId: proto.Uint64(5), PublishTime: proto.Uint64(1),
		PartitionKey: proto.String("k"), Properties: []*pulsarpb.KeyValue{{Key: proto.String("region"), Value: proto.String("eu")}}}
	raw, _ := proto.Marshal(md)
	var sm SendMetadata
	dst, single := make([]byte, 0, 4096), make([]byte, 0, 256)
	payload := make([]byte, 100)
	if n := testing.AllocsPerRun(100, func() {
		if err := ParseSendMetadata(raw, &sm); err != nil {
			t.Fatal(err)
		}
		single = sm.AppendSingleMetadata(single[:0], len(payload))
		dst = AppendEntrySendFrame(dst[:0], &Send{ProducerID: 1, SequenceID: 5}, m, payload)
	}); n != 0 {
		t.Fatalf("%v allocations per send and entry, want 0", n)
	}
}
