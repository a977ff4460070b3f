package wire

import (
	"bytes"
	"slices"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

func kv(k, v string) *pulsarpb.KeyValue {
	return &pulsarpb.KeyValue{Key: proto.String(k), Value: proto.String(v)}
}

func propsOf(md *pulsarpb.MessageMetadata) []string {
	var out []string
	for _, p := range md.Properties {
		out = append(out, p.GetKey()+"="+p.GetValue())
	}
	return out
}

func TestSetProperty(t *testing.T) {
	tests := []struct {
		name string
		in   []*pulsarpb.KeyValue
		k, v string
		want []string
	}{
		{"add to empty", nil, "a", "1", []string{"a=1"}},
		{"append new", []*pulsarpb.KeyValue{kv("x", "0")}, "a", "1", []string{"x=0", "a=1"}},
		{"replace in place", []*pulsarpb.KeyValue{kv("a", "0"), kv("x", "0")}, "a", "1", []string{"a=1", "x=0"}},
		{"drop duplicates", []*pulsarpb.KeyValue{kv("x", "0"), kv("a", "0"), kv("a", "2"), kv("y", "0")}, "a", "1", []string{"x=0", "a=1", "y=0"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			md := &pulsarpb.MessageMetadata{Properties: tc.in}
			SetProperty(md, tc.k, tc.v)
			if got := propsOf(md); !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			if v, ok := Property(md, tc.k); !ok || v != tc.v {
				t.Fatalf("Property = %q, %v", v, ok)
			}
		})
	}
	md := &pulsarpb.MessageMetadata{Properties: []*pulsarpb.KeyValue{kv("a", "0"), kv("b", "0"), kv("a", "1")}}
	DeleteProperty(md, "a")
	if got := propsOf(md); !slices.Equal(got, []string{"b=0"}) {
		t.Fatalf("DeleteProperty: %v", got)
	}
}

// TestRestampKeepsPayload stamps every field the rebatching engine sets and
// checks the re-encoded frame: new metadata, same command and payload bytes,
// valid checksum, and an unknown metadata field from a newer client kept.
func TestRestampKeepsPayload(t *testing.T) {
	orig := &pulsarpb.MessageMetadata{
		ProducerName: proto.String("p"), SequenceId: proto.Uint64(10), PublishTime: proto.Uint64(99),
		Properties: []*pulsarpb.KeyValue{kv("region", "eu")},
	}
	mdBytes, err := AppendMetadata(nil, orig)
	if err != nil {
		t.Fatal(err)
	}
	mdBytes = protowire.AppendTag(mdBytes, 40, protowire.VarintType) // unknown to us
	mdBytes = protowire.AppendVarint(mdBytes, 12345)
	payload := bytes.Repeat([]byte{0xab}, 300)
	frame := AppendSendFrame(nil, &Send{ProducerID: 1, SequenceID: 10}, mdBytes, payload)
	f, _ := decodeFrame(t, frame)

	var md pulsarpb.MessageMetadata
	if err := DecodeMetadata(f.Metadata(), &md); err != nil {
		t.Fatal(err)
	}
	SetProperty(&md, "tier", "gold")
	SetEntryHashRange(&md, 0x1234, 0xfffe)
	SetOrderingKey(&md, []byte("k1"))
	SetNumMessagesInBatch(&md, 1)
	SetSequenceIDs(&md, 10, 12)
	SetCompression(&md, pulsarpb.CompressionType_NONE, len(payload))

	out, err := AppendRestampedFrame([]byte{0xff}, f, &md)
	if err != nil {
		t.Fatal(err)
	}
	g, _ := decodeFrame(t, out[1:])
	if !bytes.Equal(g.Payload(), payload) || !bytes.Equal(g.Command(), f.Command()) {
		t.Fatal("payload or command changed")
	}
	var back pulsarpb.MessageMetadata
	if err := DecodeMetadata(g.Metadata(), &back); err != nil {
		t.Fatal(err)
	}
	if back.GetEntryHashMin() != 0x1234 || back.GetEntryHashMax() != 0xfffe || string(back.GetOrderingKey()) != "k1" ||
		back.NumMessagesInBatch == nil || back.GetNumMessagesInBatch() != 1 || back.GetSequenceId() != 10 ||
		back.GetHighestSequenceId() != 12 || back.GetUncompressedSize() != 300 || back.Compression != nil {
		t.Fatalf("stamped fields: %v", &back)
	}
	if got := propsOf(&back); !slices.Equal(got, []string{"region=eu", "tier=gold"}) {
		t.Fatalf("properties %v", got)
	}
	// Field 33 as a varint is the two-byte tag 0x88 0x02; check the raw
	// encoding so a renumbering in the .proto cannot go unnoticed.
	if !bytes.Contains(g.Metadata(), []byte{0x88, 0x02, 0xb4, 0x24}) || !bytes.Contains(g.Metadata(), []byte{0x90, 0x02, 0xfe, 0xff, 0x03}) {
		t.Fatalf("entry_hash_min/max not encoded as fields 33/34: %x", g.Metadata())
	}
	if !bytes.Contains(g.Metadata(), []byte{0xc0, 0x02, 0xb9, 0x60}) {
		t.Fatalf("unknown field 40 lost: %x", g.Metadata())
	}

	// SetSequenceIDs drops highest when it is not above lowest.
	SetSequenceIDs(&md, 20, 20)
	if md.HighestSequenceId != nil || md.GetSequenceId() != 20 {
		t.Fatal("SetSequenceIDs(20, 20)")
	}
	SetOrderingKey(&md, nil)
	if md.OrderingKey != nil {
		t.Fatal("SetOrderingKey(nil)")
	}
	SetCompression(&md, pulsarpb.CompressionType_ZSTD, 5)
	if md.GetCompression() != pulsarpb.CompressionType_ZSTD {
		t.Fatal("SetCompression")
	}
}

func TestRestampBrokerEntryMetadataKept(t *testing.T) {
	bem := []byte{0x08, 0x01, 0x10, 0x02}
	md := &pulsarpb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(1), PublishTime: proto.Uint64(1)}
	mdb, _ := AppendMetadata(nil, md)
	msg := AppendRawPayloadFrame(nil, []byte{0x08, 0x09, 0x4a, 0x08, 0x08, 0x01, 0x12, 0x04, 0x08, 0x01, 0x10, 0x02}, bem, mdb, []byte("p"))
	f, _ := decodeFrame(t, msg)
	md.EventTime = proto.Uint64(7)
	out, err := AppendRestampedFrame(nil, f, md)
	if err != nil {
		t.Fatal(err)
	}
	g, _ := decodeFrame(t, out)
	if !bytes.Equal(g.BrokerEntryMetadata(), bem) || string(g.Payload()) != "p" {
		t.Fatal("broker entry metadata or payload lost")
	}
	if _, err := AppendRestampedFrame(nil, Frame{b: AppendPingFrame(nil)}, md); err != ErrNotPayloadFrame {
		t.Fatalf("restamp simple frame: %v", err)
	}
}

func TestDecodeMetadataMalformed(t *testing.T) {
	var md pulsarpb.MessageMetadata
	if err := DecodeMetadata([]byte{0x0a, 0x05, 'a'}, &md); err != ErrMalformedMetadata {
		t.Fatalf("truncated: %v", err)
	}
}
