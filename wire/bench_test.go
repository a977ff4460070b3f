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

// BenchmarkUnbatchedSendToEntry is the metadata work of the rewriting path for one unbatched
// SEND and the entry it ends up in, both ways: "runtime" decodes the MessageMetadata with the
// protobuf runtime and marshals the message's SingleMessageMetadata and the entry's outer
// metadata from structs (the former path); "raw" scans the metadata once (ParseSendMetadata),
// moves the message's fields with AppendSingleMetadata and writes the entry with
// AppendEntrySendFrame (the path the engine takes).
func BenchmarkUnbatchedSendToEntry(b *testing.B) {
	md := &pulsarpb.MessageMetadata{
		ProducerName: proto.String("standalone-0-7"), SequenceId: proto.Uint64(41), PublishTime: proto.Uint64(1700000000000),
		PartitionKey: proto.String("user-42"), Properties: []*pulsarpb.KeyValue{{Key: proto.String("region"), Value: proto.String("eu")}},
		EventTime: proto.Uint64(1700000000001),
	}
	payload := bytes.Repeat([]byte{'x'}, 100)
	frame, err := AppendSendFrameMetadata(nil, &Send{ProducerID: 1, SequenceID: 41}, md, payload)
	if err != nil {
		b.Fatal(err)
	}
	entryPayload := make([]byte, 0, 256)
	out := make([]byte, 0, 1024)
	b.Run("runtime", func(b *testing.B) {
		var m, outer pulsarpb.MessageMetadata
		var smm pulsarpb.SingleMessageMetadata
		var single []byte
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			f, _, _ := ReadFrame(frame, 0)
			m.Reset()
			if err := DecodeMetadata(f.Metadata(), &m); err != nil {
				b.Fatal(err)
			}
			smm.Reset()
			smm.Properties, smm.PartitionKey, smm.EventTime = m.Properties, m.PartitionKey, m.EventTime
			seq, size := m.GetSequenceId(), int32(len(f.Payload()))
			smm.SequenceId, smm.PayloadSize = &seq, &size
			single, _ = proto.MarshalOptions{Deterministic: true}.MarshalAppend(single[:0], &smm)
			entryPayload = append(append(entryPayload[:0], single...), f.Payload()...)
			outer.Reset()
			outer.ProducerName, outer.SequenceId, outer.HighestSequenceId = proto.String("p"), proto.Uint64(41), proto.Uint64(41)
			outer.PublishTime, outer.NumMessagesInBatch = proto.Uint64(m.GetPublishTime()), proto.Int32(1)
			outer.UncompressedSize = proto.Uint32(uint32(len(entryPayload)))
			if out, err = AppendSendFrameMetadata(out[:0], &Send{ProducerID: 1, SequenceID: 41}, &outer, entryPayload); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("raw", func(b *testing.B) {
		var m SendMetadata
		var single []byte
		em := EntryMetadata{ProducerName: "p", SequenceID: 41, HighestSequenceID: 41, HasPublishTime: true, NumMessagesInBatch: 1}
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			f, _, _ := ReadFrame(frame, 0)
			if err := ParseSendMetadata(f.Metadata(), &m); err != nil {
				b.Fatal(err)
			}
			single = m.AppendSingleMetadata(single[:0], len(f.Payload()))
			entryPayload = append(append(entryPayload[:0], single...), f.Payload()...)
			em.PublishTime, em.UncompressedSize = m.PublishTime, uint32(len(entryPayload))
			out = AppendEntrySendFrame(out[:0], &Send{ProducerID: 1, SequenceID: 41}, &em, entryPayload)
		}
	})
}
