package proxy

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/chunkdedup"
	"github.com/rebatchproxy/rebatchproxy/rebatch"
	"github.com/rebatchproxy/rebatchproxy/route"
	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// Given a coalesce producer (max_messages 2, max_delay 10 ms) with the metrics on,
// when it sends eight messages one at a time while its first entry is unacknowledged, and the
// clock then passes the open batch's deadline,
// then rebatchproxy_rebatch_flushes_total counts, under each reason, exactly the engine's own
// count of flushes for that reason, and the sends counter the client's sends.
func TestFlushMetricsCountTheEnginesFlushesByReason(t *testing.T) {
	m, err := route.NewMatcher([]route.Rule[rebatch.Policy]{{Pattern: "a/b/*", Policy: rebatch.Policy{
		Kind: rebatch.Coalesce, MaxMessages: 2, MaxDelay: 10 * time.Millisecond}}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	metrics := NewRebatchMetrics()
	p := RebatchPaths(NewPolicies(m), metrics, NewChunkDedup(chunkdedup.Config{}), slog.New(slog.NewTextHandler(io.Discard, nil)))(
		ConnInfo{ID: 1, MaxMessageSize: 5 << 20, Now: func() time.Time { return now }})
	out := captureOut{t, &capture{}}
	readyProducer(t, p, out, 1, 11, "p1")
	for seq := range uint64(8) {
		b, err := wire.AppendSendFrameMetadata(nil, &wire.Send{ProducerID: 1, SequenceID: seq},
			&pulsarpb.MessageMetadata{ProducerName: proto.String("p1"), SequenceId: proto.Uint64(seq), PublishTime: proto.Uint64(1)}, make([]byte, 10))
		if _, err := p.FromClient(frameOf(t, b, err), out); err != nil {
			t.Fatal(err)
		}
	}

	now = now.Add(20 * time.Millisecond)
	if err := p.Tick(now, out); err != nil {
		t.Fatal(err)
	}

	s := p.(*rebatchPath).producers[1].p.Stats()
	engine := map[string]uint64{"max_messages": s.FlushMaxMessages, "max_bytes": s.FlushMaxBytes, "max_delay": s.FlushDelay,
		"group_change": s.FlushGroup, "key_change": s.FlushKeys, "explicit": s.FlushExplicit, "idle": s.FlushIdle}
	reasons := 0
	for reason, n := range engine {
		got := testutil.ToFloat64(metrics.flushes.WithLabelValues("coalesce", reason))
		if got != float64(n) {
			t.Errorf("flushes{reason=%q} = %v, the engine counted %d", reason, got, n)
		}
		if n > 0 {
			reasons++
		}
	}
	if reasons < 2 {
		t.Errorf("the workload flushed for %d reasons (%v); the spec needs at least two to tell them apart", reasons, engine)
	}
	if got := testutil.ToFloat64(metrics.sends.WithLabelValues("coalesce")); got != 8 {
		t.Errorf("sends counted %v, want 8", got)
	}
	t.Logf("engine flushes by reason: %v", engine)
}

// Given the engine's counters with a different count of flushes for every reason,
// when the path accounts them,
// then each reason's label carries its own count (no two reasons' counters swapped).
func TestFlushMetricsLabelEveryReasonWithItsOwnCount(t *testing.T) {
	metrics := NewRebatchMetrics()
	r := &rebatchPath{m: metrics, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	s := rebatch.Stats{FlushMaxMessages: 1, FlushMaxBytes: 2, FlushDelay: 3, FlushGroup: 4, FlushKeys: 5, FlushExplicit: 6, FlushIdle: 7}

	r.accountStats(&engine{kind: "properties"}, s)

	for reason, want := range map[string]float64{"max_messages": 1, "max_bytes": 2, "max_delay": 3, "group_change": 4,
		"key_change": 5, "explicit": 6, "idle": 7} {
		if got := testutil.ToFloat64(metrics.flushes.WithLabelValues("properties", reason)); got != want {
			t.Errorf("flushes{reason=%q} = %v, want %v", reason, got, want)
		}
	}
}
