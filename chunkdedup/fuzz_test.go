package chunkdedup

import (
	"maps"
	"slices"
	"testing"
	"time"
)

// copyID is what makes two chunk sends identical: key, sequence id, chunk id
// and bytes.
type copyID struct {
	producer string
	seq      uint64
	chunk    int
	fp       uint64
}

// fuzzModel is the proxy as the tracker sees it: every forwarded send is
// eventually persisted or failed, every held duplicate is eventually answered,
// promoted or cancelled.
type fuzzModel struct {
	t  *testing.T
	tr *Tracker
	// bounded: limits are small, so the tracker may forget; the
	// "no second forward" invariant only holds while nothing was forgotten.
	bounded bool

	next     Token
	sent     map[Token]copyID // every send offered
	inFlight map[Token]bool   // forwarded, fate pending
	waiting  map[Token]Token  // held duplicate -> original it waits for
	// untracked are forwarded sends the tracker declined to track.
	untracked []Token
	// stored[c] is the position a receipt reported for copy c.
	stored map[copyID][2]uint64
	// live[c] counts forwarded copies of c that are in flight or persisted
	// (not failed): while remembered, it must never exceed 1.
	live map[copyID]int
	gen  map[string]int
	// learned[c] holds the positions Learn was told the topic stores copy c at.
	learned map[copyID]map[[2]uint64]bool
}

// learn tells the tracker the topic stores copy c at 2:entry, as a look at the topic would.
func (m *fuzzModel) learn(producer string, seq uint64, chunk int, entry uint64) {
	c := copyID{producer, seq, chunk, fp(seq, chunk, m.gen[producer])}
	if m.learned[c] == nil {
		m.learned[c] = map[[2]uint64]bool{}
	}
	m.learned[c][[2]uint64{2, entry}] = true
	m.tr.Learn("t", producer, []Stored{{SequenceID: seq, ChunkID: chunk, NumChunks: 3, Fingerprint: c.fp, Ledger: 2, Entry: entry}})
}

func (m *fuzzModel) offer(producer string, seq uint64, chunk int) {
	m.next++
	tok := m.next
	c := copyID{producer, seq, chunk, fp(seq, chunk, m.gen[producer])}
	m.sent[tok] = c
	d := m.tr.Offer(Chunk{Topic: "t", Producer: producer, SequenceID: seq, ChunkID: chunk, NumChunks: 3,
		Fingerprint: c.fp, Token: tok})
	switch d.Action {
	case Forward:
		if d.Rule == RuleUntracked {
			// The tracker keeps no state for it; its fate is still
			// reported, and must be ignored.
			m.untracked = append(m.untracked, tok)
			return
		}
		if d.Rule == RuleRestarted {
			// The tracker dropped its record of this sequence id (nothing
			// of it was pending), so it no longer remembers those copies.
			for k := range m.live {
				if k.producer == c.producer && k.seq == c.seq {
					delete(m.live, k)
				}
			}
		}
		m.live[c]++
		if !m.bounded && d.Rule != RuleRestarted && m.live[c] > 1 {
			m.t.Fatalf("copy %+v forwarded again (rule %v) while an earlier copy is live", c, d.Rule)
		}
		m.inFlight[tok] = true
	case AnswerNow:
		pos, ok := m.stored[c]
		if m.learned[c][[2]uint64{d.Ledger, d.Entry}] {
			break // a stored copy a look at the topic found
		}
		if !ok || pos != [2]uint64{d.Ledger, d.Entry} {
			m.t.Fatalf("copy %+v answered %d:%d; receipts reported %v (known %v)", c, d.Ledger, d.Entry, pos, ok)
		}
	case AnswerWhenPersisted:
		if !m.inFlight[d.WaitFor] || m.sent[d.WaitFor] != c {
			m.t.Fatalf("copy %+v waits for %d, which is not an in-flight identical copy", c, d.WaitFor)
		}
		m.waiting[tok] = d.WaitFor
	case Reject:
	}
}

func (m *fuzzModel) pick(set map[Token]bool, k byte) (Token, bool) {
	if len(set) == 0 {
		return 0, false
	}
	// Deterministic choice: the k-th smallest token.
	toks := slices.Sorted(maps.Keys(set))
	return toks[int(k)%len(toks)], true
}

func (m *fuzzModel) persist(tok Token, entry uint64) {
	c := m.sent[tok]
	delete(m.inFlight, tok)
	m.stored[c] = [2]uint64{1, entry}
	answers := m.tr.Persisted(tok, 1, entry)
	for _, a := range answers {
		if m.waiting[a.Token] != tok || a.Ledger != 1 || a.Entry != entry {
			m.t.Fatalf("answer %+v for persisted %d: it waited for %d", a, tok, m.waiting[a.Token])
		}
		delete(m.waiting, a.Token)
	}
	for w, orig := range m.waiting {
		if orig == tok {
			m.t.Fatalf("waiter %d of persisted %d got no answer", w, tok)
		}
	}
}

func (m *fuzzModel) fail(tok Token) {
	c := m.sent[tok]
	delete(m.inFlight, tok)
	m.live[c]--
	promoted, ok := m.tr.Failed(tok)
	if !ok {
		for w, orig := range m.waiting {
			if orig == tok {
				m.t.Fatalf("failed %d had waiter %d but nothing was promoted", tok, w)
			}
		}
		return
	}
	if m.waiting[promoted] != tok {
		m.t.Fatalf("promoted %d did not wait for failed %d", promoted, tok)
	}
	delete(m.waiting, promoted)
	m.inFlight[promoted] = true
	m.live[c]++
	for w, orig := range m.waiting {
		if orig == tok {
			m.waiting[w] = promoted
		}
	}
}

func (m *fuzzModel) checkBounds(cfg Config) {
	s := m.tr.Stats()
	if s.Producers > cfg.MaxProducers || s.TrackedChunks > cfg.MaxTrackedChunks || s.Waiters > cfg.MaxWaiters {
		m.t.Fatalf("bounds exceeded: %+v with %+v", s, cfg)
	}
	if s.InFlight != len(m.inFlight) || s.Waiters != len(m.waiting) {
		m.t.Fatalf("tracker counts %d in flight, %d waiting; model %d, %d", s.InFlight, s.Waiters, len(m.inFlight), len(m.waiting))
	}
}

// FuzzTracker drives random event sequences through the tracker and checks
// the package invariants against a model of the proxy.
func FuzzTracker(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 1, 0, 0, 0, 0}, false)
	f.Add([]byte{0, 1, 2, 0, 0, 2, 0, 1, 2, 3, 0, 4, 0, 1, 2, 5, 0}, true)
	f.Add([]byte{0, 0, 1, 0, 0, 1, 2, 0, 1, 0, 1, 0, 0}, false)
	f.Add([]byte{6, 0, 0, 0, 0, 0, 6, 3, 1, 0, 3, 1, 5, 0, 1, 0, 0, 0}, false)
	f.Fuzz(func(t *testing.T, ops []byte, bounded bool) {
		// The model's checks are quadratic; long inputs add little.
		ops = ops[:min(len(ops), 3000)]
		cfg := Config{MaxProducers: 1000, MaxMessagesPerProducer: 1000, MaxChunksPerMessage: 3,
			MaxTrackedChunks: 1 << 20, MaxWaiters: 1 << 20, TTL: 1000 * time.Hour}
		if bounded {
			cfg = Config{MaxProducers: 2, MaxMessagesPerProducer: 2, MaxChunksPerMessage: 3,
				MaxTrackedChunks: 9, MaxWaiters: 2, TTL: time.Minute}
		}
		clk := &clock{t: time.Unix(0, 0)}
		cfg.Now = clk.now
		m := &fuzzModel{t: t, tr: New(cfg), bounded: bounded,
			sent: map[Token]copyID{}, inFlight: map[Token]bool{}, waiting: map[Token]Token{},
			stored: map[copyID][2]uint64{}, live: map[copyID]int{}, gen: map[string]int{},
			learned: map[copyID]map[[2]uint64]bool{}}
		producers := []string{"a", "b", "c"}
		for i := 0; i+2 < len(ops); i += 3 {
			op, x, y := ops[i]%7, ops[i+1], ops[i+2]
			switch op {
			case 0, 1: // a send (the most common event)
				m.offer(producers[x%3], uint64(x/3%4), int(y%3))
			case 2:
				if len(m.untracked) > 0 && y%4 == 0 {
					tok := m.untracked[0]
					m.untracked = m.untracked[1:]
					if got := m.tr.Persisted(tok, 1, 1); got != nil {
						t.Fatalf("Persisted(untracked %d) answered %+v", tok, got)
					}
				} else if tok, ok := m.pick(m.inFlight, x); ok {
					m.persist(tok, uint64(i))
				}
			case 3:
				if tok, ok := m.pick(m.inFlight, x); ok {
					m.fail(tok)
				}
			case 4:
				w := map[Token]bool{}
				for tok := range m.waiting {
					w[tok] = true
				}
				if tok, ok := m.pick(w, x); ok {
					if !m.tr.Cancel(tok) {
						t.Fatalf("Cancel(%d) of a waiter refused", tok)
					}
					delete(m.waiting, tok)
				}
			case 5:
				if y%2 == 0 {
					clk.advance(time.Duration(x) * time.Second)
				} else {
					m.gen[producers[x%3]]++ // restart: same ids, new bytes
				}
			case 6: // a look at the topic found a stored copy
				m.learn(producers[x%3], uint64(x/3%4), int(y%3), uint64(i))
			}
			m.checkBounds(cfg)
		}
		// Drain: every in-flight chunk persists; then nobody may still wait.
		for len(m.inFlight) > 0 {
			for _, tok := range slices.Sorted(maps.Keys(m.inFlight)) {
				m.persist(tok, 1<<40+uint64(tok))
			}
		}
		if len(m.waiting) != 0 || m.tr.Stats().Waiters != 0 {
			t.Fatalf("after draining, %d duplicates still wait", len(m.waiting))
		}
	})
}
