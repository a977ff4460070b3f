package batch_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/batch"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// FuzzBatchSplit feeds arbitrary buffers and counts to the splitter. It must
// never panic; whatever splits must agree with the generated decoder and
// reassemble to the identical buffer.
func FuzzBatchSplit(f *testing.F) {
	f.Add(batch.BenchBatch(f, 3, 5), 3)
	f.Add(batch.BenchBatch(f, 1, 0), 1)
	f.Add([]byte{}, 0)
	f.Add([]byte{0, 0, 0, 2, 0x18, 0x01, 'x'}, 1)
	// Uncompressed batches captured from real clients.
	paths, _ := filepath.Glob(filepath.Join("..", "testdata", "golden", "*", "*", "*.c2b.bin"))
	for _, p := range paths {
		stream, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		for len(stream) > 0 {
			fr, n, err := wire.ReadFrame(stream, 0)
			if err != nil {
				f.Fatal(err)
			}
			var md pulsarpb.MessageMetadata
			if fr.HasPayload() && wire.DecodeMetadata(fr.Metadata(), &md) == nil &&
				md.NumMessagesInBatch != nil && md.GetCompression() == pulsarpb.CompressionType_NONE {
				f.Add(bytes.Clone(fr.Payload()), int(md.GetNumMessagesInBatch()))
			}
			stream = stream[n:]
		}
	}
	f.Fuzz(func(t *testing.T, buf []byte, n int) {
		if n > 1<<16 {
			n %= 1 << 16
		}
		msgs, err := batch.Split(nil, buf, n)
		if err != nil {
			return
		}
		if len(msgs) != n {
			t.Fatalf("%d messages, declared %d", len(msgs), n)
		}
		if !bytes.Equal(batch.Assemble(nil, msgs), buf) {
			t.Fatal("reassembly differs")
		}
		for _, m := range msgs {
			meta, err := batch.ParseSingleMeta(m.Metadata)
			if err != nil {
				t.Fatal(err)
			}
			var smm pulsarpb.SingleMessageMetadata
			if err := (proto.UnmarshalOptions{AllowPartial: true}).Unmarshal(m.Metadata, &smm); err != nil {
				// The generated decoder is stricter about nested
				// messages and UTF-8; the walker only needs the
				// top level. Nothing to compare.
				continue
			}
			if meta.PayloadSize != smm.GetPayloadSize() || meta.EventTime != smm.GetEventTime() ||
				meta.SequenceID != smm.GetSequenceId() || string(meta.PartitionKey) != smm.GetPartitionKey() ||
				!bytes.Equal(meta.OrderingKey, smm.GetOrderingKey()) || meta.NumProperties != len(smm.GetProperties()) {
				t.Fatalf("hand parser %+v disagrees with generated %v", meta, &smm)
			}
			i := 0
			_ = meta.Properties(func(k, v []byte) bool {
				if string(k) != smm.Properties[i].GetKey() || string(v) != smm.Properties[i].GetValue() {
					t.Fatalf("property %d: %q=%q vs %v", i, k, v, smm.Properties[i])
				}
				i++
				return true
			})
		}
	})
}
