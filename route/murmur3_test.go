package route

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/spaolacci/murmur3"
)

// Published MurmurHash3 x86_32 vectors (the widely used SMHasher-derived set).
func TestMurmur3KnownVectors(t *testing.T) {
	tests := []struct {
		in   string
		seed uint32
		want uint32
	}{
		{"", 0, 0},
		{"", 1, 0x514E28B7},
		{"", 0xffffffff, 0x81F16F39},
		{"\x00\x00\x00\x00", 0, 0x2362F9DE},
		{"\xff\xff\xff\xff", 0, 0x76293B50},
		{"\x21\x43\x65\x87", 0, 0xF55B516B},
		{"\x21\x43\x65\x87", 0x5082EDEE, 0x2362F9DE},
		{"\x21\x43\x65", 0, 0x7E4A8634},
		{"\x21\x43", 0, 0xA0F7B07A},
		{"\x21", 0, 0x72661CF4},
		{"\x00\x00\x00", 0, 0x85F0B427},
		{"\x00\x00", 0, 0x30F4C306},
		{"\x00", 0, 0x514E28B7},
		{"aaaa", 0x9747b28c, 0x5A97808A},
		{"aaa", 0x9747b28c, 0x283E0130},
		{"aa", 0x9747b28c, 0x5D211726},
		{"a", 0x9747b28c, 0x7FA09EA6},
		{"abcd", 0x9747b28c, 0xF0478627},
		{"abc", 0x9747b28c, 0xC84A62DD},
		{"ab", 0x9747b28c, 0x74875592},
		{"Hello, world!", 0x9747b28c, 0x24884CBA},
		{"The quick brown fox jumps over the lazy dog", 0x9747b28c, 0x2FA826CD},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%q/%#x", tt.in, tt.seed), func(t *testing.T) {
			if got := Murmur3x86_32([]byte(tt.in), tt.seed); got != tt.want {
				t.Errorf("Murmur3x86_32(%q, %#x) = %#08x, want %#08x", tt.in, tt.seed, got, tt.want)
			}
		})
	}
}

// spaolacci/murmur3 is what pulsar-client-go hashes keys with; it serves here
// as an oracle only.
func TestMurmur3MatchesClientImplementation(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var keys [][]byte
	for i := range 5000 {
		keys = append(keys, fmt.Appendf(nil, "key-%d", i))
	}
	for n := range 200 { // every tail length, blocks up to 49
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		keys = append(keys, b)
	}
	for _, k := range keys {
		for _, seed := range []uint32{0, 1, 0x9747b28c} {
			if got, want := Murmur3x86_32(k, seed), murmur3.Sum32WithSeed(k, seed); got != want {
				t.Fatalf("Murmur3x86_32(%x, %#x) = %#08x, spaolacci says %#08x", k, seed, got, want)
			}
		}
	}
}

func FuzzMurmur3(f *testing.F) {
	f.Add([]byte("orders-42"), uint32(0))
	f.Add([]byte{}, uint32(7))
	f.Fuzz(func(t *testing.T, b []byte, seed uint32) {
		if got, want := Murmur3x86_32(b, seed), murmur3.Sum32WithSeed(b, seed); got != want {
			t.Fatalf("Murmur3x86_32(%x, %#x) = %#08x, spaolacci says %#08x", b, seed, got, want)
		}
	})
}

var sinkU16 uint16

func BenchmarkHashB(b *testing.B) {
	for _, n := range []int{8, 36, 128} {
		key := make([]byte, n)
		for i := range key {
			key[i] = byte('a' + i%26)
		}
		b.Run(fmt.Sprintf("len%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				sinkU16 = HashB(key)
			}
		})
	}
}
