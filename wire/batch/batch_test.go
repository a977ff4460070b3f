package batch

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

func kv(k, v string) *pulsarpb.KeyValue {
	return &pulsarpb.KeyValue{Key: proto.String(k), Value: proto.String(v)}
}

// build encodes a batch with the generated code, independent of the
// hand-written parser under test.
func build(t testing.TB, smms []*pulsarpb.SingleMessageMetadata, payloads [][]byte) []byte {
	t.Helper()
	var buf []byte
	for i, smm := range smms {
		smm.PayloadSize = proto.Int32(int32(len(payloads[i])))
		md, err := proto.Marshal(smm)
		if err != nil {
			t.Fatal(err)
		}
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(md)))
		buf = append(buf, md...)
		buf = append(buf, payloads[i]...)
	}
	return buf
}

func TestIterator(t *testing.T) {
	smms := []*pulsarpb.SingleMessageMetadata{
		{PartitionKey: proto.String("user-1"), EventTime: proto.Uint64(5), SequenceId: proto.Uint64(100),
			Properties: []*pulsarpb.KeyValue{kv("a", "1"), kv("b", "2")}},
		{OrderingKey: []byte("ok"), PartitionKey: proto.String("pk"), PartitionKeyB64Encoded: proto.Bool(true), NullValue: proto.Bool(true)},
		{CompactedOut: proto.Bool(true), NullPartitionKey: proto.Bool(true)},
	}
	payloads := [][]byte{[]byte("first"), nil, []byte("third payload")}
	buf := build(t, smms, payloads)

	it := NewIterator(buf, 3)
	var got []SingleMeta
	var msgs []Message
	for it.Next() {
		got = append(got, it.Meta())
		msgs = append(msgs, it.Message())
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("%d messages", len(got))
	}
	for i := range payloads {
		if !bytes.Equal(msgs[i].Payload, payloads[i]) || int(got[i].PayloadSize) != len(payloads[i]) {
			t.Fatalf("message %d payload %q", i, msgs[i].Payload)
		}
		var smm pulsarpb.SingleMessageMetadata
		if err := DecodeSingleMeta(msgs[i].Metadata, &smm); err != nil || !proto.Equal(&smm, smms[i]) {
			t.Fatalf("message %d metadata: %v %v", i, &smm, err)
		}
	}
	m0, m1, m2 := got[0], got[1], got[2]
	if string(m0.PartitionKey) != "user-1" || !m0.HasPartitionKey || m0.HasOrderingKey || m0.EventTime != 5 ||
		m0.SequenceID != 100 || !m0.HasSequenceID || m0.NumProperties != 2 || string(m0.Key()) != "user-1" {
		t.Fatalf("meta 0: %+v", m0)
	}
	if v, ok := m0.Property("b"); !ok || string(v) != "2" {
		t.Fatalf("Property(b) = %q %v", v, ok)
	}
	if _, ok := m0.Property("zz"); ok {
		t.Fatal("Property(zz) found")
	}
	if string(m1.Key()) != "ok" || !m1.PartitionKeyB64Encoded || !m1.NullValue || m1.HasSequenceID {
		t.Fatalf("meta 1: %+v", m1)
	}
	if !m2.CompactedOut || !m2.NullPartitionKey || m2.HasPartitionKey || m2.Key() != nil {
		t.Fatalf("meta 2: %+v", m2)
	}

	// Reassembly of the split is byte-identical; a subset in another order
	// is a valid batch of those messages.
	if out := Assemble(nil, msgs); !bytes.Equal(out, buf) {
		t.Fatal("Assemble(split) differs from the original")
	}
	sub := Assemble([]byte("pfx"), []Message{msgs[2], msgs[0]})
	again, err := Split(nil, sub[3:], 2)
	if err != nil || !bytes.Equal(again[0].Payload, payloads[2]) || !bytes.Equal(again[1].Payload, payloads[0]) {
		t.Fatalf("subset split: %v", err)
	}
}

func TestMalformed(t *testing.T) {
	one := build(t, []*pulsarpb.SingleMessageMetadata{{}}, [][]byte{[]byte("abc")})
	tests := []struct {
		name string
		buf  []byte
		n    int
	}{
		{"negative count", one, -1},
		{"fewer records than declared", one, 2},
		{"trailing bytes", append(bytes.Clone(one), 0), 1},
		{"zero declared, bytes present", one, 0},
		{"short size prefix", one[:3], 1},
		{"metadata size beyond buffer", append(binary.BigEndian.AppendUint32(nil, 99), one[4:]...), 1},
		{"payload beyond buffer", one[:len(one)-1], 1},
		{"missing payload_size", append(binary.BigEndian.AppendUint32(nil, 2), 0x28, 0x01), 1},
		{"negative payload_size", append(binary.BigEndian.AppendUint32(nil, 11), 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01), 1},
		{"truncated metadata varint", append(binary.BigEndian.AppendUint32(nil, 2), 0x18, 0x80), 1},
		{"group wire type", append(binary.BigEndian.AppendUint32(nil, 3), 0x18, 0x00, 0x0b), 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Split([]Message{{}}, tc.buf, tc.n)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("err = %v", err)
			}
			if len(got) != 1 {
				t.Fatal("dst not restored on error")
			}
		})
	}
	if msgs, err := Split(nil, nil, 0); err != nil || len(msgs) != 0 {
		t.Fatalf("empty batch: %v", err)
	}
}

func TestAppendNewMessage(t *testing.T) {
	smm := &pulsarpb.SingleMessageMetadata{PartitionKey: proto.String("k"), PayloadSize: proto.Int32(999)}
	buf, err := AppendNewMessage(nil, smm, []byte("payload"))
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := Split(nil, buf, 1)
	if err != nil || string(msgs[0].Payload) != "payload" {
		t.Fatalf("split: %v", err)
	}
	m, _ := ParseSingleMeta(msgs[0].Metadata)
	if m.PayloadSize != 7 || string(m.PartitionKey) != "k" {
		t.Fatalf("meta %+v", m)
	}
}

// Splitting must not allocate per message: the engine walks every batch it
// rebatches.
func TestIteratorAllocs(t *testing.T) {
	buf := benchBatch(t, 100, 100)
	allocs := testing.AllocsPerRun(100, func() {
		it := NewIterator(buf, 100)
		for it.Next() {
			_ = it.Meta().Key()
		}
		if it.Err() != nil {
			panic(it.Err())
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocs per batch", allocs)
	}
	dst := make([]Message, 0, 100)
	out := make([]byte, 0, len(buf))
	allocs = testing.AllocsPerRun(100, func() {
		msgs, err := Split(dst[:0], buf, 100)
		if err != nil {
			panic(err)
		}
		_ = Assemble(out[:0], msgs)
	})
	if allocs != 0 {
		t.Fatalf("Split+Assemble with capacity: %v allocs", allocs)
	}
}

// benchBatch builds n messages of size bytes each, keyed, with a
// property, like a typical keyed producer's batch.
func benchBatch(t testing.TB, n, size int) []byte {
	smms := make([]*pulsarpb.SingleMessageMetadata, n)
	payloads := make([][]byte, n)
	for i := range smms {
		smms[i] = &pulsarpb.SingleMessageMetadata{
			PartitionKey: proto.String(fmt.Sprintf("key-%04d", i%64)),
			SequenceId:   proto.Uint64(uint64(i)),
			EventTime:    proto.Uint64(1700000000000),
			Properties:   []*pulsarpb.KeyValue{kv("region", "eu")},
		}
		payloads[i] = bytes.Repeat([]byte{byte(i)}, size)
	}
	return build(t, smms, payloads)
}

// Properties yields every property wherever it lies among the other fields, and stops after
// the last one (NumProperties) without reading the rest.
func TestPropertiesAmongOtherFields(t *testing.T) {
	kv := func(k, v string) []byte {
		b := append([]byte{0x0a, byte(len(k))}, k...)
		b = append(append(b, 0x12, byte(len(v))), v...)
		return append([]byte{0x0a, byte(len(b))}, b...)
	}
	raw := append([]byte{0x18, 5}, kv("a", "1")...)          // payload_size, then a property
	raw = append(append(raw, 0x40, 7), kv("b", "")...)       // sequence_id, another property
	raw = append(append(raw, 0x12, 1, 'k'), kv("a", "2")...) // partition_key, a repeated key
	tail := len(raw)
	raw = append(raw, 0xff) // not protobuf: read only by a walk that did not stop
	meta, err := ParseSingleMeta(raw[:tail])
	if err != nil {
		t.Fatal(err)
	}
	meta.SetRaw(raw, tail) // the properties lie within raw[:tail]
	var got []string
	if err := meta.Properties(func(k, v []byte) bool { got = append(got, string(k)+"="+string(v)); return true }); err != nil {
		t.Fatalf("Properties read past its last property: %v", err)
	}
	if strings.Join(got, ",") != "a=1,b=,a=2" {
		t.Fatalf("properties %v, want a=1, b=, a=2", got)
	}
	if v, ok := meta.Property("a"); !ok || string(v) != "1" {
		t.Fatalf("Property(a) = %q, %v; want the first, 1", v, ok)
	}
}

// Given the encoded metadata of a message without a sequence id (a batch numbered as one),
// when sequence id 42 is appended to it,
// then it parses as the same message with sequence id 42.
func TestAppendWithSequenceIDSetsOnlyTheID(t *testing.T) {
	raw, err := proto.Marshal(&pulsarpb.SingleMessageMetadata{PayloadSize: proto.Int32(3), PartitionKey: proto.String("k"),
		Properties: []*pulsarpb.KeyValue{{Key: proto.String("a"), Value: proto.String("1")}}, EventTime: proto.Uint64(7)})
	if err != nil {
		t.Fatal(err)
	}
	before, err := ParseSingleMeta(raw)
	if err != nil {
		t.Fatal(err)
	}

	after, err := ParseSingleMeta(AppendWithSequenceID(nil, raw, 42))

	if err != nil || !after.HasSequenceID || after.SequenceID != 42 {
		t.Fatalf("parsed %+v, %v; want sequence id 42", after, err)
	}
	after.HasSequenceID, after.SequenceID = false, 0
	if after.PayloadSize != before.PayloadSize || string(after.PartitionKey) != "k" || after.EventTime != 7 ||
		string(after.PropertiesRaw()) != string(before.PropertiesRaw()) {
		t.Fatalf("other fields changed: %+v, was %+v", after, before)
	}
}
