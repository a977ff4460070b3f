package route

import (
	"bytes"
	"fmt"
	"math"
	"testing"

	"github.com/spaolacci/murmur3"
)

func TestMessageKey(t *testing.T) {
	tests := []struct {
		name    string
		in      KeyFields
		want    string
		wantOK  bool
		wantErr bool
	}{
		{"ordering key wins over partition key",
			KeyFields{OrderingKey: []byte("ok"), HasOrderingKey: true, PartitionKey: "pk", HasPartitionKey: true}, "ok", true, false},
		{"present but empty ordering key is a key",
			KeyFields{HasOrderingKey: true, PartitionKey: "pk", HasPartitionKey: true}, "", true, false},
		{"partition key as UTF-8", KeyFields{PartitionKey: "clé", HasPartitionKey: true}, "clé", true, false},
		{"partition key base64 padded",
			KeyFields{PartitionKey: "AAEC/w==", HasPartitionKey: true, PartitionKeyB64: true}, "\x00\x01\x02\xff", true, false},
		{"partition key base64 unpadded, as Java accepts",
			KeyFields{PartitionKey: "AAEC/w", HasPartitionKey: true, PartitionKeyB64: true}, "\x00\x01\x02\xff", true, false},
		{"base64 with wrong padding", KeyFields{PartitionKey: "AAEC/w=", HasPartitionKey: true, PartitionKeyB64: true}, "", false, true},
		{"base64 with a line break, which Java rejects",
			KeyFields{PartitionKey: "AAEC\n/w==", HasPartitionKey: true, PartitionKeyB64: true}, "", false, true},
		{"base64 url alphabet is not the basic one",
			KeyFields{PartitionKey: "AAEC_w==", HasPartitionKey: true, PartitionKeyB64: true}, "", false, true},
		{"invalid UTF-8 becomes U+FFFD as in a Java String",
			KeyFields{PartitionKey: "a\xffb", HasPartitionKey: true}, "a\uFFFDb", true, false},
		{"no key", KeyFields{ProducerName: "p", HasProducerName: true, SequenceID: 1, HasSequenceID: true}, "", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok, err := MessageKey(tt.in)
			if (err != nil) != tt.wantErr || ok != tt.wantOK || string(got) != tt.want {
				t.Errorf("MessageKey = %q, %v, %v; want %q, %v, err=%v", got, ok, err, tt.want, tt.wantOK, tt.wantErr)
			}
		})
	}
}

func TestStickyKey(t *testing.T) {
	tests := []struct {
		name string
		in   KeyFields
		want string
	}{
		{"ordering key", KeyFields{OrderingKey: []byte("o"), HasOrderingKey: true}, "o"},
		{"partition key", KeyFields{PartitionKey: "p", HasPartitionKey: true, ProducerName: "x", HasProducerName: true}, "p"},
		{"producer and sequence fallback",
			KeyFields{ProducerName: "standalone-0-7", HasProducerName: true, SequenceID: 42, HasSequenceID: true}, "standalone-0-7-42"},
		{"sequence id printed as a signed Java long",
			KeyFields{ProducerName: "p", HasProducerName: true, SequenceID: math.MaxUint64, HasSequenceID: true}, "p--1"},
		{"producer name without sequence id", KeyFields{ProducerName: "p", HasProducerName: true}, "NONE_KEY"},
		{"nothing", KeyFields{}, "NONE_KEY"},
		{"bad base64 falls back to NONE_KEY, not to the producer key",
			KeyFields{PartitionKey: "!!", HasPartitionKey: true, PartitionKeyB64: true, ProducerName: "p", HasProducerName: true, SequenceID: 1, HasSequenceID: true}, "NONE_KEY"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := StickyKey(tt.in); string(got) != tt.want {
				t.Errorf("StickyKey = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestHashBIsLow16BitsOfClientMurmur(t *testing.T) {
	for i := range 20000 {
		k := fmt.Appendf(nil, "k%d", i)
		if got, want := HashB(k), uint16(murmur3.Sum32(k)); got != want {
			t.Fatalf("HashB(%q) = %d, want %d", k, got, want)
		}
	}
}

// keyWithHashB finds a key whose hashB is h; about 65536 tries on average.
func keyWithHashB(t *testing.T, h uint16) []byte {
	t.Helper()
	for i := range 2_000_000 {
		k := fmt.Appendf(nil, "find-%d", i)
		if HashB(k) == h {
			return k
		}
	}
	t.Fatalf("no key with hashB %d found", h)
	return nil
}

func TestStickySlot(t *testing.T) {
	zero := keyWithHashB(t, 0)
	tests := []struct {
		name string
		key  []byte
		want int
	}{
		{"hashB 0 is remapped to slot 1", zero, 1},
		{"hashB 1 stays 1", keyWithHashB(t, 1), 1},
		{"top of the ring", keyWithHashB(t, 65535), 65535},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := StickySlot(tt.key); got != tt.want {
				t.Errorf("StickySlot(%q) = %d, want %d", tt.key, got, tt.want)
			}
		})
	}
}

func TestStickySlotEqualsHashBExceptZero(t *testing.T) {
	for i := range 20000 {
		k := fmt.Appendf(nil, "s%d", i)
		want := int(HashB(k))
		if want == 0 {
			want = 1
		}
		if got := StickySlot(k); got != want {
			t.Fatalf("StickySlot(%q) = %d, want %d", k, got, want)
		}
	}
}

func TestConsistentHashingSlot(t *testing.T) {
	differ := 0
	for i := range 20000 {
		k := fmt.Appendf(nil, "c%d", i)
		h := murmur3.Sum32(k)
		want := int(h&0x7FFFFFFF)%65535 + 1
		got := ConsistentHashingSlot(k)
		if got != want || got < 1 || got > 65535 {
			t.Fatalf("ConsistentHashingSlot(%q) = %d, want %d", k, got, want)
		}
		if got != StickySlot(k) {
			differ++
		}
	}
	// The point of having both: the default selector does not use hashB.
	if differ < 19000 {
		t.Errorf("only %d of 20000 keys have a consistent-hashing slot different from the STICKY slot", differ)
	}
}

func TestMessageKeyAliasesOrderingKey(t *testing.T) {
	// Given an ordering key
	ok := []byte("abc")
	// When the key is resolved
	got, _, _ := MessageKey(KeyFields{OrderingKey: ok, HasOrderingKey: true})
	// Then no copy was made (the hot path must not allocate)
	if &got[0] != &ok[0] || !bytes.Equal(got, ok) {
		t.Errorf("MessageKey copied the ordering key")
	}
}
