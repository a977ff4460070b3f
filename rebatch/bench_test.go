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
		ackAll(b, p, &out, &seq)
	}
	b.ReportMetric(float64(b.N*len(frames)*perSend)/b.Elapsed().Seconds(), "msgs/s")
}

// unbatchedCases are the rewriting policies on unbatched 100-byte sends: properties alternates
// two regions in runs of 50; buckets spreads 100 keys over 4 buckets.
var unbatchedCases = []struct {
	name string
	pol  Policy
	msg  func(i int) msg
}{
	{"coalesce", Policy{Kind: Coalesce}, func(int) msg { return msg{} }},
	{"properties", Policy{Kind: Properties, Restricted: map[string][]string{"region": {"us", "eu"}}},
		func(i int) msg { return msg{props: map[string]string{"region": [2]string{"us", "eu"}[i/50%2]}} }},
	{"buckets", Policy{Kind: Buckets, Buckets: 4}, func(i int) msg { return msg{key: fmt.Sprintf("k%d", i%100)} }},
}

// unbatchedEngine is an engine under pol (its lanes open) and a round of 1,000 unbatched sends;
// round takes them, flushes, acknowledges every entry and releases the receipts, ready for the
// next round.
func unbatchedEngine(tb testing.TB, pol Policy, mk func(i int) msg) (p *Producer, round func()) {
	const sends = 1000
	sendFrames := make([][]byte, sends)
	for i := range sendFrames {
		m := mk(i)
		m.seq, m.payload = uint64(i), string(make([]byte, 100))
		sendFrames[i] = clientSingle(tb, m)
	}
	p = newEngine(tb, pol, -1)
	var out Output
	if pol.Kind == Buckets {
		next := uint64(1000)
		if err := p.OpenLanes("persistent://a/b/t", nil, func() uint64 { next++; return next }, &out); err != nil {
			tb.Fatal(err)
		}
		for _, f := range frames(tb, out.Broker) {
			var cmd pulsarpb.BaseCommand
			if err := wire.DecodeCommand(f, &cmd); err != nil {
				tb.Fatal(err)
			}
			p.LaneOpened(cmd.GetProducer().GetRequestId(), -1)
		}
		out.Broker = out.Broker[:0]
	}
	entryID := uint64(0)
	return p, func() {
		for _, fb := range sendFrames {
			f, _, _ := wire.ReadFrame(fb, 5<<20)
			if err := p.Send(t0, f, &out); err != nil {
				tb.Fatal(err)
			}
		}
		if err := p.Flush(&out); err != nil {
			tb.Fatal(err)
		}
		ackAll(tb, p, &out, &entryID)
	}
}

// BenchmarkUnbatchedSends measures the engine on unbatched sends of 100 bytes, one message per
// SEND (the workload coalescing exists for), under each rewriting policy: admit, place, flush
// entries, acknowledge them, release the receipts.
func BenchmarkUnbatchedSends(b *testing.B) {
	for _, c := range unbatchedCases {
		b.Run(c.name, func(b *testing.B) {
			p, round := unbatchedEngine(b, c.pol, c.msg)
			built := p.stats.EntriesBuilt
			b.ReportAllocs()
			b.ResetTimer()
			for n := 0; n < b.N; n++ {
				round()
			}
			b.StopTimer()
			if p.stats.EntriesBuilt == built {
				b.Fatal("no entry built: the benchmark measures nothing")
			}
			b.ReportMetric(float64(b.N*1000)/b.Elapsed().Seconds(), "msgs/s")
			b.ReportMetric(float64(b.N*1000)/float64(p.stats.EntriesBuilt-built), "msgs/entry")
		})
	}
}

// ackAll acknowledges every entry in flight on every lane, as the broker would (entry ids from
// *entryID on), checks that no send is left pending, clears out, and rewinds the engine's marks
// so that the same sends again are not taken for resends.
func ackAll(tb testing.TB, p *Producer, out *Output, entryID *uint64) {
	for _, l := range p.lanes {
		for len(l.entries) > 0 {
			e := l.entries[0]
			if err := p.Receipt(wire.SendReceipt{ProducerID: l.producerID, SequenceID: e.lo, HasMessageID: true, LedgerID: 1, EntryID: *entryID}, out); err != nil {
				tb.Fatal(err)
			}
			*entryID++
		}
		l.lastPushed, l.persisted = -1, -1
	}
	p.ownMark = -1
	if p.Pending() != 0 {
		tb.Fatalf("%d sends still pending after every entry was acknowledged", p.Pending())
	}
	out.Broker, out.Client = out.Broker[:0], out.Client[:0]
}
