package rebatch

import (
	"fmt"
	"testing"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// BenchmarkCoalesceClientBatches measures the engine on client batches of 100 messages of 100
// bytes: split, merge into entries of 1,000, acknowledge, release receipts. "mixed-keys" has 100
// keys per batch merged across keys (split_keys: false); "one-key" has one key throughout under
// the default split_keys, which pays for classifying every message by its Key_Shared hash.
func BenchmarkCoalesceClientBatches(b *testing.B) {
	b.Run("mixed-keys", func(b *testing.B) {
		benchCoalesce(b, Policy{Kind: Coalesce, SplitKeys: mixKeys}, func(i int) string { return fmt.Sprintf("k%d", i) })
	})
	b.Run("one-key", func(b *testing.B) {
		benchCoalesce(b, Policy{Kind: Coalesce}, func(int) string { return "k" })
	})
}

func benchCoalesce(b *testing.B, pol Policy, key func(i int) string) {
	const perSend = 100
	var frames [][]byte
	for s := 0; s < 10; s++ {
		var msgs []msg
		for i := 0; i < perSend; i++ {
			msgs = append(msgs, msg{key: key(i), payload: string(make([]byte, 100)), seq: uint64(s*perSend + i)})
		}
		frames = append(frames, clientBatch(b, msgs, pulsarpb.CompressionType_NONE, nil))
	}
	p := newEngine(b, pol, -1)
	var out Output
	seq := uint64(0)
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		for _, fb := range frames {
			f, _, _ := wire.ReadFrame(fb, 5<<20)
			if err := p.Send(t0, f, &out); err != nil {
				b.Fatal(err)
			}
		}
		_ = p.Flush(&out)
		for len(p.lanes[0].entries) > 0 {
			e := p.lanes[0].entries[0]
			if err := p.Receipt(wire.SendReceipt{ProducerID: pid, SequenceID: e.lo, HasMessageID: true, LedgerID: 1, EntryID: seq}, &out); err != nil {
				b.Fatal(err)
			}
			seq++
		}
		out.Broker, out.Client = out.Broker[:0], out.Client[:0]
		// The same sends again must not look like resends.
		p.lanes[0].lastPushed = -1
	}
	b.ReportMetric(float64(b.N*len(frames)*perSend)/b.Elapsed().Seconds(), "msgs/s")
}
