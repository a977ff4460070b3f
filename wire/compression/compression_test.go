package compression

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/klauspost/compress/zlib"

	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

var codecs = []pulsarpb.CompressionType{
	pulsarpb.CompressionType_NONE,
	pulsarpb.CompressionType_LZ4,
	pulsarpb.CompressionType_ZLIB,
	pulsarpb.CompressionType_ZSTD,
	pulsarpb.CompressionType_SNAPPY,
}

func inputs() map[string][]byte {
	rng := rand.New(rand.NewPCG(1, 2))
	random := make([]byte, 70_000)
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	return map[string][]byte{
		"empty":        {},
		"one byte":     {'x'},
		"short text":   []byte("hello, pulsar"),
		"fifteen":      bytes.Repeat([]byte{'z'}, 15), // LZ4 literal-length boundary
		"repetitive":   bytes.Repeat([]byte("key-0042 value "), 5000),
		"random":       random,
		"random small": random[:300],
	}
}

func TestRoundTrip(t *testing.T) {
	for _, c := range codecs {
		for name, in := range inputs() {
			t.Run(c.String()+"/"+name, func(t *testing.T) {
				comp, err := Compress([]byte("hdr"), c, in)
				if err != nil {
					t.Fatal(err)
				}
				if string(comp[:3]) != "hdr" {
					t.Fatal("Compress lost dst prefix")
				}
				out, err := Decompress([]byte("pre"), c, comp[3:], len(in), 0)
				if err != nil {
					t.Fatal(err)
				}
				if string(out[:3]) != "pre" || !bytes.Equal(out[3:], in) {
					t.Fatalf("round trip differs (len %d vs %d)", len(out)-3, len(in))
				}
			})
		}
	}
}

// The formats must be the ones other Pulsar clients write, not merely
// self-consistent: check the framing bytes each codec is known by.
func TestFormats(t *testing.T) {
	in := bytes.Repeat([]byte("abc"), 100)
	z, _ := Compress(nil, pulsarpb.CompressionType_ZLIB, in)
	if z[0] != 0x78 || (uint16(z[0])<<8|uint16(z[1]))%31 != 0 {
		t.Fatalf("ZLIB header %x is not RFC 1950", z[:2])
	}
	s, _ := Compress(nil, pulsarpb.CompressionType_ZSTD, in)
	if !bytes.HasPrefix(s, []byte{0x28, 0xb5, 0x2f, 0xfd}) {
		t.Fatalf("ZSTD magic %x", s[:4])
	}
	n, _ := Compress(nil, pulsarpb.CompressionType_SNAPPY, in)
	if n[0] != 0xac || n[1] != 0x02 { // raw block: varint(300) first, no stream header
		t.Fatalf("SNAPPY preamble %x", n[:2])
	}
	l, _ := Compress(nil, pulsarpb.CompressionType_LZ4, in)
	if bytes.HasPrefix(l, []byte{0x04, 0x22, 0x4d, 0x18}) {
		t.Fatal("LZ4 output has a frame header; Pulsar uses raw blocks")
	}
	// A literal-only LZ4 block decodes with the reference decoder.
	lit := appendLZ4Literals(nil, in[:40])
	out, err := Decompress(nil, pulsarpb.CompressionType_LZ4, lit, 40, 0)
	if err != nil || !bytes.Equal(out, in[:40]) {
		t.Fatalf("literal block: %v", err)
	}
}

type decompressCase struct {
	name string
	c    pulsarpb.CompressionType
	src  []byte
	size int
	max  int
	want error
}

func TestDecompressErrors(t *testing.T) {
	good := map[pulsarpb.CompressionType][]byte{}
	for _, c := range codecs {
		good[c], _ = Compress(nil, c, []byte("some payload bytes, some payload bytes"))
	}
	const size = 38
	tests := []decompressCase{
		{"negative size", pulsarpb.CompressionType_LZ4, good[pulsarpb.CompressionType_LZ4], -1, 0, ErrTooLarge},
		{"size over max", pulsarpb.CompressionType_ZSTD, good[pulsarpb.CompressionType_ZSTD], size, size - 1, ErrTooLarge},
		{"unknown codec", 9, good[pulsarpb.CompressionType_NONE], size, 0, ErrUnknownCodec},
		{"none size mismatch", pulsarpb.CompressionType_NONE, good[pulsarpb.CompressionType_NONE], size + 1, 0, ErrCorrupt},
	}
	for _, c := range codecs[1:] {
		src := good[c]
		tests = append(tests,
			decompressCase{c.String() + " declared too small", c, src, size - 1, 0, ErrCorrupt},
			decompressCase{c.String() + " declared too big", c, src, size + 1, 0, ErrCorrupt},
			decompressCase{c.String() + " truncated", c, src[:len(src)-1], size, 0, ErrCorrupt},
			decompressCase{c.String() + " garbage", c, []byte{0xff, 0xff, 0xff, 0xff, 0xff}, size, 0, ErrCorrupt},
		)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst := []byte("keep")
			out, err := Decompress(dst, tc.c, tc.src, tc.size, tc.max)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if string(out) != "keep" {
				t.Fatalf("dst changed on error: %q", out)
			}
		})
	}
}

// The Java client's ZLIB output is sync-flushed and never finished (it ends
// with 00 00 ff ff and has no Adler-32 trailer); it must decode.
func TestZlibSyncFlushed(t *testing.T) {
	in := bytes.Repeat([]byte("java deflater, SYNC_FLUSH "), 40)
	var buf bytes.Buffer
	w := zlib.NewWriter(&buf)
	if _, err := w.Write(in); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil { // sync flush, no Close
		t.Fatal(err)
	}
	src := buf.Bytes()
	if !bytes.HasSuffix(src, []byte{0, 0, 0xff, 0xff}) {
		t.Fatalf("not a sync-flushed stream: %x", src[len(src)-4:])
	}
	out, err := Decompress(nil, pulsarpb.CompressionType_ZLIB, src, len(in), 0)
	if err != nil || !bytes.Equal(out, in) {
		t.Fatalf("sync-flushed stream: %v", err)
	}
	// Still exact: one byte more or less than declared is corrupt.
	for _, size := range []int{len(in) - 1, len(in) + 1} {
		if _, err := Decompress(nil, pulsarpb.CompressionType_ZLIB, src, size, 0); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("declared %d of %d: %v", size, len(in), err)
		}
	}
	// A finished stream with a wrong Adler-32 is still rejected.
	fin, _ := Compress(nil, pulsarpb.CompressionType_ZLIB, in)
	fin[len(fin)-1] ^= 1
	if _, err := Decompress(nil, pulsarpb.CompressionType_ZLIB, fin, len(in), 0); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("bad Adler-32: %v", err)
	}
}

// A tiny payload claiming 4 GiB must fail before any large allocation, both
// when uncompressed_size says so and when the codec's own header says so.
func TestDecompressionBomb(t *testing.T) {
	// snappy preamble varint(4 GiB - 1) followed by nothing useful.
	snappyBomb := binary.AppendUvarint(nil, 1<<32-1)
	snappyBomb = append(snappyBomb, 0, 0, 0)
	// zstd frame header: single segment, 8-byte content size = 4 GiB.
	zstdBomb := []byte{0x28, 0xb5, 0x2f, 0xfd, 0xe0, 0, 0, 0, 0, 1, 0, 0, 0}
	// zlib stream of a huge run is small; this one expands past 1 KiB.
	zlibBomb, _ := Compress(nil, pulsarpb.CompressionType_ZLIB, make([]byte, 1<<20))
	lz4Bomb, _ := Compress(nil, pulsarpb.CompressionType_LZ4, make([]byte, 1<<20))

	tiny := []byte("0123456789")
	for _, c := range codecs[1:] {
		allocs := testing.AllocsPerRun(5, func() {
			if _, err := Decompress(nil, c, tiny, 1<<32, 0); !errors.Is(err, ErrTooLarge) {
				t.Fatalf("%v: 4 GiB declared: %v", c, err)
			}
		})
		if allocs != 0 {
			t.Fatalf("%v: rejecting the declared size allocated", c)
		}
	}
	// Declared size small, data expanding further: fail without producing
	// more than the declared size.
	for _, tc := range []struct {
		c   pulsarpb.CompressionType
		src []byte
	}{
		{pulsarpb.CompressionType_SNAPPY, snappyBomb},
		{pulsarpb.CompressionType_ZSTD, zstdBomb},
		{pulsarpb.CompressionType_ZLIB, zlibBomb},
		{pulsarpb.CompressionType_LZ4, lz4Bomb},
	} {
		if _, err := Decompress(nil, tc.c, tc.src, 1024, 0); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%v bomb with 1 KiB declared: %v", tc.c, err)
		}
	}
}
