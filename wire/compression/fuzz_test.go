package compression

import (
	"bytes"
	"testing"

	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// fuzzMax keeps fuzzing cheap: declared sizes above it are rejected.
const fuzzMax = 1 << 20

// fuzzDecompress checks, for arbitrary input, that Decompress never panics,
// never returns more or fewer bytes than declared, never touches dst on
// error, and that whatever decodes re-compresses to something that decodes
// to the same bytes.
func fuzzDecompress(f *testing.F, c pulsarpb.CompressionType) {
	for _, in := range [][]byte{nil, []byte("a"), []byte("hello hello hello hello"), bytes.Repeat([]byte{7}, 5000)} {
		comp, err := Compress(nil, c, in)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(comp, uint32(len(in)))
		f.Add(comp, uint32(len(in)+1))
	}
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f}, uint32(100))
	f.Fuzz(func(t *testing.T, src []byte, size uint32) {
		dst := []byte("x")
		out, err := Decompress(dst, c, src, int(size), fuzzMax)
		if err != nil {
			if len(out) != 1 {
				t.Fatalf("dst changed on error")
			}
			return
		}
		if len(out) != 1+int(size) {
			t.Fatalf("got %d bytes, declared %d", len(out)-1, size)
		}
		again, err := Compress(nil, c, out[1:])
		if err != nil {
			t.Fatal(err)
		}
		back, err := Decompress(nil, c, again, int(size), fuzzMax)
		if err != nil || !bytes.Equal(back, out[1:]) {
			t.Fatalf("re-compression does not round-trip: %v", err)
		}
	})
}

func FuzzDecompressNone(f *testing.F)   { fuzzDecompress(f, pulsarpb.CompressionType_NONE) }
func FuzzDecompressLZ4(f *testing.F)    { fuzzDecompress(f, pulsarpb.CompressionType_LZ4) }
func FuzzDecompressZlib(f *testing.F)   { fuzzDecompress(f, pulsarpb.CompressionType_ZLIB) }
func FuzzDecompressZstd(f *testing.F)   { fuzzDecompress(f, pulsarpb.CompressionType_ZSTD) }
func FuzzDecompressSnappy(f *testing.F) { fuzzDecompress(f, pulsarpb.CompressionType_SNAPPY) }
