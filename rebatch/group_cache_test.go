package rebatch

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire/batch"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// Given a properties policy restricting region to us and eu,
// when messages whose properties repeat, change, reorder, add an unrestricted key or carry a
// value outside the allowed ones are grouped one after the other,
// then each gets the group a producer that never saw the others gives it: the group kept
// from the previous message is reused only for the same encoded properties.
func TestGroupOfReusesTheLastGroupOnlyForTheSameProperties(t *testing.T) {
	pol := Policy{Kind: Properties, Restricted: map[string][]string{"region": {"us", "eu"}}}
	seq := []map[string]string{
		{}, {"region": "us"}, {"region": "us"}, {"region": "eu"}, {"region": "eu"},
		{"region": "us", "tier": "a"}, {"tier": "a", "region": "us"}, {"region": "ap"}, {}, {"region": "us"},
	}
	p := newEngine(t, pol, -1)
	for i, props := range seq {
		m := singleMetaWith(t, props, i%2 == 0)

		got := bytes.Clone(p.groupOf(&m))

		if want := newEngine(t, pol, -1).groupOf(&m); !bytes.Equal(got, want) {
			t.Errorf("message %d %v: group %x, afresh %x", i, props, got, want)
		}
	}
}

// singleMetaWith encodes a SingleMessageMetadata with props (in key order, reversed when
// reverse) and parses it.
func singleMetaWith(t *testing.T, props map[string]string, reverse bool) batch.SingleMeta {
	t.Helper()
	kv := kvs(props)
	if reverse {
		for i, j := 0, len(kv)-1; i < j; i, j = i+1, j-1 {
			kv[i], kv[j] = kv[j], kv[i]
		}
	}
	return singleMetaOf(t, kv)
}

// singleMetaOf encodes a SingleMessageMetadata with the properties kv, in order, and parses it.
func singleMetaOf(t *testing.T, kv []*pulsarpb.KeyValue) batch.SingleMeta {
	t.Helper()
	b, err := proto.Marshal(&pulsarpb.SingleMessageMetadata{Properties: kv, PayloadSize: proto.Int32(1)})
	if err != nil {
		t.Fatal(err)
	}
	m, err := batch.ParseSingleMeta(b)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Given a properties policy restricting region to us and eu,
// when a message carries a restricted key twice (which no client API makes, but the protocol
// allows),
// then its group is that of the key's last value, the one the Java and Go clients show their
// consumers (their property maps keep the later value; C++ keeps the first): us then eu is eu,
// us then ap is no region.
func TestGroupOfTakesARepeatedKeysLastValue(t *testing.T) {
	pol := Policy{Kind: Properties, Restricted: map[string][]string{"region": {"us", "eu"}}}
	for _, c := range []struct {
		values []string
		want   map[string]string
	}{
		{[]string{"us", "eu"}, map[string]string{"region": "eu"}},
		{[]string{"us", "ap"}, map[string]string{}},
		{[]string{"ap", "us"}, map[string]string{"region": "us"}},
	} {
		var kv []*pulsarpb.KeyValue
		for _, v := range c.values {
			kv = append(kv, &pulsarpb.KeyValue{Key: proto.String("region"), Value: proto.String(v)})
		}
		m := singleMetaOf(t, kv)

		got := bytes.Clone(newEngine(t, pol, -1).groupOf(&m))

		want := newEngine(t, pol, -1).groupOf(ptr(singleMetaWith(t, c.want, false)))
		if !bytes.Equal(got, want) {
			t.Errorf("region %v: group %x, want that of %v (%x)", c.values, got, c.want, want)
		}
	}
}

func ptr[T any](v T) *T { return &v }
