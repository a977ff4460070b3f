package proxy

import (
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rebatchproxy/rebatchproxy/chunkdedup"
)

// ChunkDedup is the proxy-wide duplicate-chunk state (PIP-295 done in the proxy): one
// chunkdedup.Tracker keyed by (topic, producer name), shared by every connection because a
// client that lost its connection resends on a new one.
//
// A decision taken on one connection can concern a chunk held on another: a resent chunk that
// waits for its original, in flight on the old connection, is answered when that original's
// receipt arrives there; if the original fails, the copy is forwarded by the connection that
// holds it. Such events go through a mailbox that each connection polls on its ticks.
//
// Order: while a held copy waits, the sends its producer makes after it (chunks or not) are
// queued behind it on that connection (copied, at most 16 MiB per connection; beyond that
// they go on at once, with a logged warning), and held copies are settled in the order the
// client sent them. So when originals fail and their copies are forwarded after all, the
// broker still stores the producer's sends in the client's order: a later chunk of a message
// never lands before an earlier one.
//
// Any goroutine may call its methods.
type ChunkDedup struct {
	t    *chunkdedup.Tracker
	mu   sync.Mutex
	mail map[chunkdedup.Token]chunkEvent

	// The look at what another instance stored (chunk_recovery.go); reader nil: off.
	reader     StoredReader
	log        *slog.Logger
	recovering map[producerKey]*recovery // guarded by mu

	decisions       *prometheus.CounterVec
	recoveries      *prometheus.CounterVec
	recoveryEntries prometheus.Counter
}

// chunkEvent is the outcome of a held duplicate, for the connection holding it.
type chunkEvent struct {
	promote       bool // forward it after all: its original failed
	ledger, entry uint64
}

// NewChunkDedup returns the shared state with the given tracker bounds.
func NewChunkDedup(cfg chunkdedup.Config) *ChunkDedup {
	recoveries, entries := newRecoveryMetrics()
	return &ChunkDedup{
		t:          chunkdedup.New(cfg),
		mail:       map[chunkdedup.Token]chunkEvent{},
		log:        slog.Default(),
		recovering: map[producerKey]*recovery{},
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rebatchproxy_chunk_decisions_total",
			Help: "Chunks offered to duplicate-chunk removal, by the rule that decided (persisted and in_flight are duplicates dropped)."},
			[]string{"rule"}),
		recoveries:      recoveries,
		recoveryEntries: entries,
	}
}

// Collectors returns the metrics for registration.
func (c *ChunkDedup) Collectors() []prometheus.Collector {
	return []prometheus.Collector{c.decisions, c.recoveries, c.recoveryEntries}
}

// Stats returns the tracker's counters.
func (c *ChunkDedup) Stats() chunkdedup.Stats { return c.t.Stats() }

func (c *ChunkDedup) post(tok chunkdedup.Token, ev chunkEvent) {
	c.mu.Lock()
	c.mail[tok] = ev
	c.mu.Unlock()
}

func (c *ChunkDedup) take(tok chunkdedup.Token) (chunkEvent, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ev, ok := c.mail[tok]
	if ok {
		delete(c.mail, tok)
	}
	return ev, ok
}
