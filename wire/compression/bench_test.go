package compression

import (
	"bytes"
	"fmt"
	"testing"
)

// BenchmarkCodecs compresses and decompresses a 100 KB batch-like buffer
// (keyed records, repetitive as real batches are) with each codec.
func BenchmarkCodecs(b *testing.B) {
	var in []byte
	for i := 0; len(in) < 100_000; i++ {
		in = fmt.Appendf(in, "\x00\x00\x00\x10key-%04d event=%d payload=%s;", i%64, i, bytes.Repeat([]byte{'a' + byte(i%26)}, 60))
	}
	for _, c := range codecs {
		comp, _ := Compress(nil, c, in)
		b.Run(c.String()+"/compress", func(b *testing.B) {
			b.SetBytes(int64(len(in)))
			dst := make([]byte, 0, 2*len(in))
			for i := 0; i < b.N; i++ {
				dst, _ = Compress(dst[:0], c, in)
			}
		})
		b.Run(c.String()+"/decompress", func(b *testing.B) {
			b.SetBytes(int64(len(in)))
			b.ReportAllocs()
			dst := make([]byte, 0, len(in))
			for i := 0; i < b.N; i++ {
				var err error
				if dst, err = Decompress(dst[:0], c, comp, len(in), 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
