package wire

import (
	"bytes"
	"slices"
	"sort"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// applyStruct applies s through the decoded-struct helpers: the reference
// the raw stamping must agree with.
func applyStruct(md *pulsarpb.MessageMetadata, s *Stamp) {
	for _, k := range s.DeleteProperties {
		DeleteProperty(md, k)
	}
	for _, p := range s.SetProperties {
		DeleteProperty(md, p.Key)
		SetProperty(md, p.Key, p.Value)
	}
	if s.SetOrderingKey {
		SetOrderingKey(md, s.OrderingKey)
	}
	if s.SetNumMessagesInBatch {
		SetNumMessagesInBatch(md, s.NumMessagesInBatch)
	}
	if s.SetSequenceID {
		md.SequenceId = proto.Uint64(s.SequenceID)
	}
	if s.SetHighestSequenceID {
		md.HighestSequenceId = proto.Uint64(s.HighestSequenceID)
	}
	if s.SetEntryHashRange {
		SetEntryHashRange(md, s.EntryHashMin, s.EntryHashMax)
	}
}

// sameMetadata compares two decoded metadata, properties as an ordered
// multiset of key=value (raw stamping moves stamped properties last).
func sameMetadata(t *testing.T, got, want *pulsarpb.MessageMetadata) {
	t.Helper()
	norm := func(m *pulsarpb.MessageMetadata) []string {
		var out []string
		for _, p := range m.Properties {
			out = append(out, p.GetKey()+"="+p.GetValue())
		}
		sort.Strings(out)
		return out
	}
	if g, w := norm(got), norm(want); !slices.Equal(g, w) {
		t.Fatalf("properties %v, want %v", g, w)
	}
	g, w := proto.Clone(got).(*pulsarpb.MessageMetadata), proto.Clone(want).(*pulsarpb.MessageMetadata)
	g.Properties, w.Properties = nil, nil
	if !proto.Equal(g, w) {
		t.Fatalf("got %v\nwant %v", g, w)
	}
}

func TestStampMatchesStructHelpers(t *testing.T) {
	base := &pulsarpb.MessageMetadata{
		ProducerName: proto.String("p"), SequenceId: proto.Uint64(7), PublishTime: proto.Uint64(9),
		Properties:  []*pulsarpb.KeyValue{kv("a", "1"), kv("b", "2"), kv("a", "3")},
		OrderingKey: []byte("old"), NumMessagesInBatch: proto.Int32(4), EntryHashMin: proto.Uint32(1),
	}
	raw, _ := AppendMetadata(nil, base)
	raw = protowire.AppendTag(raw, 45, protowire.BytesType) // unknown field, kept
	raw = protowire.AppendString(raw, "future")

	tests := []struct {
		name string
		s    Stamp
	}{
		{"nothing", Stamp{}},
		{"set new property", Stamp{SetProperties: []KeyValue{{"tier", "gold"}}}},
		{"replace duplicated property", Stamp{SetProperties: []KeyValue{{"a", "9"}}}},
		{"delete property", Stamp{DeleteProperties: []string{"a"}}},
		{"ordering key", Stamp{SetOrderingKey: true, OrderingKey: []byte("k")}},
		{"remove ordering key", Stamp{SetOrderingKey: true}},
		{"batch and sequence", Stamp{SetNumMessagesInBatch: true, NumMessagesInBatch: 1, SetSequenceID: true, SequenceID: 100, SetHighestSequenceID: true, HighestSequenceID: 120}},
		{"entry hash range", Stamp{SetEntryHashRange: true, EntryHashMin: 0, EntryHashMax: 65535}},
		{"everything", Stamp{
			SetProperties: []KeyValue{{"b", "x"}, {"c", "y"}}, DeleteProperties: []string{"a"},
			SetOrderingKey: true, OrderingKey: []byte{0, 1}, SetNumMessagesInBatch: true, NumMessagesInBatch: 3,
			SetSequenceID: true, SequenceID: 1, SetEntryHashRange: true, EntryHashMin: 5, EntryHashMax: 6,
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := AppendStampedMetadata([]byte("x"), raw, &tc.s)
			if err != nil {
				t.Fatal(err)
			}
			var got, want pulsarpb.MessageMetadata
			if err := DecodeMetadata(out[1:], &got); err != nil {
				t.Fatal(err)
			}
			if err := DecodeMetadata(raw, &want); err != nil {
				t.Fatal(err)
			}
			applyStruct(&want, &tc.s)
			sameMetadata(t, &got, &want)
			if !bytes.Contains(out, []byte("future")) {
				t.Fatal("unknown field lost")
			}
		})
	}
	if _, err := AppendStampedMetadata(nil, []byte{0x0a, 0x09}, &Stamp{}); err != ErrMalformedMetadata {
		t.Fatalf("malformed: %v", err)
	}
}

func TestStampedFrame(t *testing.T) {
	md := &pulsarpb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(1), PublishTime: proto.Uint64(2)}
	mdb, _ := AppendMetadata(nil, md)
	frame := AppendRawPayloadFrame(nil, []byte{0x08, 0x09, 0x4a, 0x08, 0x08, 0x01, 0x12, 0x04, 0x08, 0x01, 0x10, 0x02}, []byte{0x08, 0x05}, mdb, []byte("payload"))
	f, _ := decodeFrame(t, frame)
	s := &Stamp{SetProperties: []KeyValue{{"k", "v"}}, SetEntryHashRange: true, EntryHashMin: 3, EntryHashMax: 4}
	out, err := AppendStampedFrame(nil, f, s)
	if err != nil {
		t.Fatal(err)
	}
	g, _ := decodeFrame(t, out) // checks the CRC
	if !bytes.Equal(g.Command(), f.Command()) || !bytes.Equal(g.BrokerEntryMetadata(), f.BrokerEntryMetadata()) || string(g.Payload()) != "payload" {
		t.Fatal("command, broker entry metadata or payload changed")
	}
	var back pulsarpb.MessageMetadata
	if err := DecodeMetadata(g.Metadata(), &back); err != nil || back.GetEntryHashMax() != 4 || len(back.Properties) != 1 {
		t.Fatalf("stamped metadata %v: %v", &back, err)
	}
	// A zero stamp reproduces the frame.
	if same, _ := AppendStampedFrame(nil, f, &Stamp{}); !bytes.Equal(same, frame) {
		t.Fatal("zero stamp changed the frame")
	}
	if _, err := AppendStampedFrame(nil, Frame{b: AppendPingFrame(nil)}, s); err != ErrNotPayloadFrame {
		t.Fatal(err)
	}
	dst := make([]byte, 0, 2*len(frame))
	if allocs := testing.AllocsPerRun(100, func() { _, _ = AppendStampedFrame(dst[:0], f, s) }); allocs != 0 {
		t.Fatalf("AppendStampedFrame allocates %v times", allocs)
	}
}
