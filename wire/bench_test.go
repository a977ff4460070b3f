package wire

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// benchStream holds 1,000 SEND frames of exactly 128 bytes each.
func benchStream(b *testing.B) []byte {
	md := &pulsarpb.MessageMetadata{ProducerName: proto.String("standalone-0-7"), SequenceId: proto.Uint64(1), PublishTime: proto.Uint64(1700000000000)}
	mdb, _ := AppendMetadata(nil, md)
	one := AppendSendFrame(nil, &Send{ProducerID: 1, SequenceID: 1}, mdb, nil)
	payload := bytes.Repeat([]byte{'x'}, 128-len(one))
	var s []byte
	for i := 0; i < 1000; i++ {
		s = AppendSendFrame(s, &Send{ProducerID: 1, SequenceID: uint64(i % 100)}, mdb, payload)
	}
	if len(s) != 128*1000 {
		b.Fatalf("frames are %d bytes", len(s)/1000)
	}
	return s
}

// BenchmarkReadFrame128 measures the header-only path (what passthrough
// forwarding needs) over 128-byte frames; ns/op is per frame.
func BenchmarkReadFrame128(b *testing.B) {
	s := benchStream(b)
	b.SetBytes(128)
	b.ReportAllocs()
	b.ResetTimer()
	buf := s
	for i := 0; i < b.N; i++ {
		if len(buf) == 0 {
			buf = s
		}
		f, n, err := ReadFrame(buf, 0)
		if err != nil || f.Type() != pulsarpb.BaseCommand_SEND {
			b.Fatal(err)
		}
		buf = buf[n:]
	}
}

// BenchmarkReadFrame128Checksum adds CRC32C verification per frame.
func BenchmarkReadFrame128Checksum(b *testing.B) {
	s := benchStream(b)
	b.SetBytes(128)
	b.ReportAllocs()
	b.ResetTimer()
	buf := s
	for i := 0; i < b.N; i++ {
		if len(buf) == 0 {
			buf = s
		}
		f, n, err := ReadFrame(buf, 0)
		if err != nil {
			b.Fatal(err)
		}
		if err := f.VerifyChecksum(); err != nil {
			b.Fatal(err)
		}
		buf = buf[n:]
	}
}

// goBatchSend is a SEND of a 10-message LZ4 batch with the metadata a Go client writes.
func goBatchSend(b *testing.B) []byte {
	b.Helper()
	md := &pulsarpb.MessageMetadata{
		ProducerName: proto.String("standalone-0-7"), SequenceId: proto.Uint64(41), PublishTime: proto.Uint64(1700000000000),
		PartitionKey: proto.String("user-42"), Properties: []*pulsarpb.KeyValue{{Key: proto.String("region"), Value: proto.String("eu")}},
		NumMessagesInBatch: proto.Int32(10), UncompressedSize: proto.Uint32(1000), Compression: pulsarpb.CompressionType_LZ4.Enum(),
	}
	frame, err := AppendSendFrameMetadata(nil, &Send{ProducerID: 1, SequenceID: 41, NumMessages: 10}, md, bytes.Repeat([]byte{'x'}, 1000))
	if err != nil {
		b.Fatal(err)
	}
	return frame
}

// BenchmarkSendRestamp is the rewriting-policy path for one SEND: read the
// frame, parse CommandSend, decode the metadata, stamp properties and the
// PIP-486 range, and write the frame back with a fresh CRC. The metadata is
// what a Go-client batch carries.
func BenchmarkSendRestamp(b *testing.B) {
	frame := goBatchSend(b)
	out := make([]byte, 0, 2*len(frame))
	var m pulsarpb.MessageMetadata
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f, _, err := ReadFrame(frame, 0)
		if err != nil {
			b.Fatal(err)
		}
		s, err := ParseSend(f)
		if err != nil {
			b.Fatal(err)
		}
		if err := DecodeMetadata(f.Metadata(), &m); err != nil {
			b.Fatal(err)
		}
		SetProperty(&m, "tier", "gold")
		SetEntryHashRange(&m, 100, 200)
		s.SequenceID++
		out, err = AppendSendFrameMetadata(out[:0], &s, &m, f.Payload())
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSendStampRaw is BenchmarkSendRestamp's work without decoding the
// metadata: the same two stamps applied by AppendStampedFrame.
func BenchmarkSendStampRaw(b *testing.B) {
	frame := goBatchSend(b)
	out := make([]byte, 0, 2*len(frame))
	st := &Stamp{SetProperties: []KeyValue{{"tier", "gold"}}, SetEntryHashRange: true, EntryHashMin: 100, EntryHashMax: 200}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f, _, err := ReadFrame(frame, 0)
		if err != nil {
			b.Fatal(err)
		}
		if out, err = AppendStampedFrame(out[:0], f, st); err != nil {
			b.Fatal(err)
		}
	}
}
