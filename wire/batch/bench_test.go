package batch

import "testing"

// BenchmarkSplitAssemble splits a batch of 1,000 x 100-byte keyed messages
// and assembles it again (uncompressed); MB/s counts the batch once.
func BenchmarkSplitAssemble(b *testing.B) {
	buf := benchBatch(b, 1000, 100)
	msgs := make([]Message, 0, 1000)
	out := make([]byte, 0, len(buf))
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var err error
		msgs, err = Split(msgs[:0], buf, 1000)
		if err != nil {
			b.Fatal(err)
		}
		out = Assemble(out[:0], msgs)
	}
}

// BenchmarkIterate walks the same batch reading each message's key, the
// per-message work of the buckets policy before hashing.
func BenchmarkIterate(b *testing.B) {
	buf := benchBatch(b, 1000, 100)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		it := NewIterator(buf, 1000)
		for it.Next() {
			_ = it.Meta().Key()
		}
		if it.Err() != nil {
			b.Fatal(it.Err())
		}
	}
}
