package chunkdedup

import (
	"testing"
	"time"
)

// clock is a fake clock the tests advance by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

func newTracker(cfg Config) (*Tracker, *clock) {
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	cfg.Now = c.now
	return New(cfg), c
}

// fp stands for the CRC of a chunk's bytes; gen models a restarted producer.
func fp(seq uint64, id, gen int) uint64 { return seq<<32 | uint64(id)<<8 | uint64(gen) }

// ck builds chunk id of a 4-chunk message seq from producer "p" on topic "t".
func ck(seq uint64, id int, tok Token) Chunk {
	return Chunk{Topic: "persistent://a/b/t", Producer: "p", SequenceID: seq, ChunkID: id, NumChunks: 4,
		Fingerprint: fp(seq, id, 0), Token: tok}
}

// forwardAndPersist offers c, which must be forwarded, and persists it at 7:entry.
func forwardAndPersist(t *testing.T, tr *Tracker, c Chunk, entry uint64) {
	t.Helper()
	if d := tr.Offer(c); d.Action != Forward {
		t.Fatalf("setup: Offer(%+v) = %+v, want Forward", c, d)
	}
	tr.Persisted(c.Token, 7, entry)
}

func TestOfferRules(t *testing.T) {
	other := func(c Chunk, f func(*Chunk)) Chunk { f(&c); return c }
	tests := []struct {
		name  string
		given func(t *testing.T, tr *Tracker)
		when  Chunk
		want  Decision
	}{
		{"first copy is forwarded", func(*testing.T, *Tracker) {}, ck(1, 0, 1),
			Decision{Action: Forward, Rule: RuleFirstCopy}},
		{"chunk 0 resent after it persisted gets its stored position",
			func(t *testing.T, tr *Tracker) { forwardAndPersist(t, tr, ck(1, 0, 1), 100) },
			ck(1, 0, 2), Decision{Action: AnswerNow, Rule: RulePersisted, Ledger: 7, Entry: 100}},
		{"middle chunk resent gets its own stored position, not chunk 0's",
			func(t *testing.T, tr *Tracker) {
				forwardAndPersist(t, tr, ck(1, 0, 1), 100)
				forwardAndPersist(t, tr, ck(1, 1, 2), 101)
				forwardAndPersist(t, tr, ck(1, 2, 3), 102)
			},
			ck(1, 1, 9), Decision{Action: AnswerNow, Rule: RulePersisted, Ledger: 7, Entry: 101}},
		{"last chunk resent gets its stored position, not -1:-1",
			func(t *testing.T, tr *Tracker) {
				for i := range 4 {
					forwardAndPersist(t, tr, ck(1, i, Token(i+1)), uint64(100+i))
				}
			},
			ck(1, 3, 9), Decision{Action: AnswerNow, Rule: RulePersisted, Ledger: 7, Entry: 103}},
		{"chunk resent while the original is in flight waits for it",
			func(t *testing.T, tr *Tracker) { tr.Offer(ck(1, 0, 1)) },
			ck(1, 0, 2), Decision{Action: AnswerWhenPersisted, Rule: RuleInFlight, WaitFor: 1}},
		{"chunk whose original failed is forwarded again",
			func(t *testing.T, tr *Tracker) { tr.Offer(ck(1, 0, 1)); tr.Failed(1) },
			ck(1, 0, 2), Decision{Action: Forward, Rule: RuleFirstCopy}},
		{"chunk the broker answered -1:-1 for is forwarded again, never answered -1:-1",
			func(t *testing.T, tr *Tracker) {
				tr.Offer(ck(1, 3, 1))
				tr.Persisted(1, UnknownPosition, UnknownPosition)
			},
			ck(1, 3, 2), Decision{Action: Forward, Rule: RuleFirstCopy}},
		{"a newer message is forwarded",
			func(t *testing.T, tr *Tracker) { forwardAndPersist(t, tr, ck(1, 0, 1), 100) },
			ck(2, 0, 2), Decision{Action: Forward, Rule: RuleFirstCopy}},
		{"an older message stays remembered after a newer one started",
			func(t *testing.T, tr *Tracker) {
				forwardAndPersist(t, tr, ck(1, 2, 1), 102)
				forwardAndPersist(t, tr, ck(2, 0, 2), 200)
			},
			ck(1, 2, 3), Decision{Action: AnswerNow, Rule: RulePersisted, Ledger: 7, Entry: 102}},
		{"same sequence id with other bytes is a restarted producer",
			func(t *testing.T, tr *Tracker) { forwardAndPersist(t, tr, ck(5, 0, 1), 100) },
			other(ck(5, 0, 2), func(c *Chunk) { c.Fingerprint = fp(5, 0, 1) }),
			Decision{Action: Forward, Rule: RuleRestarted}},
		{"same sequence id with another chunk count is a restarted producer",
			func(t *testing.T, tr *Tracker) { forwardAndPersist(t, tr, ck(5, 0, 1), 100) },
			other(ck(5, 0, 2), func(c *Chunk) { c.NumChunks = 3 }),
			Decision{Action: Forward, Rule: RuleRestarted}},
		{"restarted producer's lower sequence id is forwarded, below the mark",
			func(t *testing.T, tr *Tracker) { forwardAndPersist(t, tr, ck(10, 0, 1), 100) },
			ck(0, 0, 2), Decision{Action: Forward, Rule: RuleForgotten}},
		{"another producer with the same sequence id is independent",
			func(t *testing.T, tr *Tracker) { forwardAndPersist(t, tr, ck(1, 0, 1), 100) },
			other(ck(1, 0, 2), func(c *Chunk) { c.Producer = "q" }),
			Decision{Action: Forward, Rule: RuleFirstCopy}},
		{"the same producer name on another topic is independent",
			func(t *testing.T, tr *Tracker) { forwardAndPersist(t, tr, ck(1, 0, 1), 100) },
			other(ck(1, 0, 2), func(c *Chunk) { c.Topic = "persistent://a/b/t-partition-1" }),
			Decision{Action: Forward, Rule: RuleFirstCopy}},
		{"chunk id out of range is forwarded untracked", func(*testing.T, *Tracker) {},
			other(ck(1, 4, 1), func(*Chunk) {}), Decision{Action: Forward, Rule: RuleUntracked}},
		{"a single-chunk message is not a chunk", func(*testing.T, *Tracker) {},
			other(ck(1, 0, 1), func(c *Chunk) { c.NumChunks = 1 }), Decision{Action: Forward, Rule: RuleUntracked}},
		{"a token still outstanding is refused tracking",
			func(t *testing.T, tr *Tracker) { tr.Offer(ck(1, 0, 1)) },
			ck(1, 1, 1), Decision{Action: Forward, Rule: RuleUntracked}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, _ := newTracker(Config{})
			tt.given(t, tr)
			if got := tr.Offer(tt.when); got != tt.want {
				t.Errorf("Offer(%+v) = %+v, want %+v", tt.when, got, tt.want)
			}
		})
	}
}

func TestReconnectResendOfAllPendingChunks(t *testing.T) {
	// Given chunks 0 and 1 persisted, 2 in flight and 3 lost at the cut
	tr, _ := newTracker(Config{})
	forwardAndPersist(t, tr, ck(1, 0, 1), 100)
	forwardAndPersist(t, tr, ck(1, 1, 2), 101)
	tr.Offer(ck(1, 2, 3))
	// When the client resends every pending chunk on its new connection
	var got []Decision
	for i := range 4 {
		got = append(got, tr.Offer(ck(1, i, Token(10+i))))
	}
	// Then only chunk 3 reaches the broker
	want := []Decision{
		{Action: AnswerNow, Rule: RulePersisted, Ledger: 7, Entry: 100},
		{Action: AnswerNow, Rule: RulePersisted, Ledger: 7, Entry: 101},
		{Action: AnswerWhenPersisted, Rule: RuleInFlight, WaitFor: 3},
		{Action: Forward, Rule: RuleFirstCopy},
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("chunk %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestWaitingDuplicatesAnsweredWhenOriginalPersists(t *testing.T) {
	// Given an in-flight chunk and two copies waiting for it
	tr, _ := newTracker(Config{})
	tr.Offer(ck(1, 2, 1))
	tr.Offer(ck(1, 2, 2))
	tr.Offer(ck(1, 2, 3))
	// When the original's receipt arrives
	got := tr.Persisted(1, 7, 55)
	// Then both copies are answered with its position, in arrival order
	want := []Answer{{Token: 2, Ledger: 7, Entry: 55}, {Token: 3, Ledger: 7, Entry: 55}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("Persisted = %+v, want %+v", got, want)
	}
	if s := tr.Stats(); s.Waiters != 0 || s.InFlight != 0 {
		t.Errorf("after: %d waiters, %d in flight; want none", s.Waiters, s.InFlight)
	}
}

func TestFailedOriginalPromotesFirstWaiter(t *testing.T) {
	// Given an in-flight chunk and two copies waiting for it
	tr, _ := newTracker(Config{})
	tr.Offer(ck(1, 2, 1))
	tr.Offer(ck(1, 2, 2))
	tr.Offer(ck(1, 2, 3))
	// When the broker fails the original
	promoted, ok := tr.Failed(1)
	// Then the first copy must be forwarded, and the second now waits for it
	if !ok || promoted != 2 {
		t.Fatalf("Failed = %d, %v; want 2, true", promoted, ok)
	}
	if got := tr.Persisted(2, 7, 9); len(got) != 1 || got[0] != (Answer{Token: 3, Ledger: 7, Entry: 9}) {
		t.Errorf("after promotion, Persisted(2) = %+v, want token 3 answered at 7:9", got)
	}
}

func TestFailedChunkIsNotPersisted(t *testing.T) {
	// Given a chunk forwarded and persisted mark at chunk 0
	tr, _ := newTracker(Config{})
	forwardAndPersist(t, tr, ck(1, 0, 1), 100)
	tr.Offer(ck(1, 1, 2))
	// When the broker answers chunk 1 with a send error
	tr.Failed(2)
	// Then the persisted mark has not moved and nothing is in flight
	m, _ := tr.Marks("persistent://a/b/t", "p")
	if m.Persisted != (Position{1, 0}) || m.Forwarded != (Position{1, 1}) || tr.Stats().InFlight != 0 {
		t.Errorf("marks %+v, in flight %d; want persisted 1/0, forwarded 1/1, none in flight", m, tr.Stats().InFlight)
	}
}

func TestCancelWithdrawsWaiter(t *testing.T) {
	// Given a waiting copy
	tr, _ := newTracker(Config{})
	tr.Offer(ck(1, 0, 1))
	tr.Offer(ck(1, 0, 2))
	// When its client goes away
	ok := tr.Cancel(2)
	// Then it no longer waits, and the original's receipt answers nobody
	if !ok || tr.Stats().Waiters != 0 || len(tr.Persisted(1, 7, 1)) != 0 {
		t.Errorf("Cancel = %v, waiters %d; want withdrawn", ok, tr.Stats().Waiters)
	}
}

func TestCancelRefusesForwardedChunk(t *testing.T) {
	// Given a forwarded chunk
	tr, _ := newTracker(Config{})
	tr.Offer(ck(1, 0, 1))
	// When the caller tries to cancel it
	ok := tr.Cancel(1)
	// Then it is refused: its fate must come from the broker
	if ok || tr.Stats().InFlight != 1 {
		t.Errorf("Cancel(forwarded) = %v, in flight %d", ok, tr.Stats().InFlight)
	}
}

func TestTTLExpiry(t *testing.T) {
	// Given a producer idle for longer than the TTL
	tr, clk := newTracker(Config{TTL: time.Minute})
	forwardAndPersist(t, tr, ck(1, 0, 1), 100)
	clk.advance(time.Minute)
	// When the tracker expires idle state
	n := tr.Expire()
	// Then it is gone, and so a resend is forwarded
	if _, ok := tr.Marks("persistent://a/b/t", "p"); n != 1 || ok {
		t.Fatalf("Expire = %d, still tracked %v", n, ok)
	}
	if d := tr.Offer(ck(1, 0, 2)); d.Action != Forward || tr.Stats().EvictedTTL != 1 {
		t.Errorf("after expiry Offer = %+v, EvictedTTL %d", d, tr.Stats().EvictedTTL)
	}
}

func TestTTLSparesProducerWithChunkInFlight(t *testing.T) {
	// Given a producer idle past the TTL but with a chunk in flight
	tr, clk := newTracker(Config{TTL: time.Minute})
	tr.Offer(ck(1, 0, 1))
	clk.advance(time.Hour)
	// When the tracker expires idle state
	n := tr.Expire()
	// Then the producer is kept, since a receipt is still due
	if _, ok := tr.Marks("persistent://a/b/t", "p"); n != 0 || !ok {
		t.Errorf("Expire = %d, tracked %v; want kept", n, ok)
	}
}

func TestTTLCountsFromLastUse(t *testing.T) {
	// Given a producer used again half a TTL after its first chunk
	tr, clk := newTracker(Config{TTL: time.Minute})
	forwardAndPersist(t, tr, ck(1, 0, 1), 100)
	clk.advance(40 * time.Second)
	forwardAndPersist(t, tr, ck(1, 1, 2), 101)
	clk.advance(40 * time.Second)
	// When the tracker expires idle state
	n := tr.Expire()
	// Then it is kept: 40 s idle < 1 min
	if n != 0 {
		t.Errorf("Expire = %d, want 0", n)
	}
}

func at(producer string, seq uint64, id int, tok Token) Chunk {
	c := ck(seq, id, tok)
	c.Producer = producer
	return c
}

func TestLRUEvictsLeastRecentlyUsedProducer(t *testing.T) {
	// Given room for two producers, A used after B
	tr, _ := newTracker(Config{MaxProducers: 2})
	forwardAndPersist(t, tr, at("A", 1, 0, 1), 1)
	forwardAndPersist(t, tr, at("B", 1, 0, 2), 2)
	forwardAndPersist(t, tr, at("A", 1, 1, 3), 3)
	// When a third producer arrives
	tr.Offer(at("C", 1, 0, 4))
	// Then B, the least recently used, is evicted
	_, a := tr.Marks("persistent://a/b/t", "A")
	_, b := tr.Marks("persistent://a/b/t", "B")
	if !a || b || tr.Stats().Producers != 2 || tr.Stats().EvictedLRU != 1 {
		t.Errorf("A kept %v, B kept %v, stats %+v", a, b, tr.Stats())
	}
}

func TestTrackedChunksStayWithinBound(t *testing.T) {
	// Given room for 8 chunk slots, held by two producers' 4-chunk messages
	tr, _ := newTracker(Config{MaxTrackedChunks: 8})
	forwardAndPersist(t, tr, at("A", 1, 0, 1), 1)
	forwardAndPersist(t, tr, at("B", 1, 0, 2), 2)
	// When a third producer starts a message
	d := tr.Offer(at("C", 1, 0, 3))
	// Then it is tracked, the least recently used producer made room, and the bound holds
	if s := tr.Stats(); d.Rule != RuleFirstCopy || s.TrackedChunks != 8 || s.EvictedLRU != 1 {
		t.Errorf("Offer = %+v, stats %+v", d, s)
	}
}

func TestMessageWindowDropsOldestMessage(t *testing.T) {
	// Given a window of two messages, both remembered
	tr, _ := newTracker(Config{MaxMessagesPerProducer: 2})
	forwardAndPersist(t, tr, ck(1, 0, 1), 1)
	forwardAndPersist(t, tr, ck(2, 0, 2), 2)
	forwardAndPersist(t, tr, ck(3, 0, 3), 3)
	// When the oldest message's chunk is resent
	d := tr.Offer(ck(1, 0, 4))
	// Then it is no longer remembered: forwarded, counted as forgotten
	if d != (Decision{Action: Forward, Rule: RuleForgotten}) || tr.Stats().MessagesDropped < 1 {
		t.Errorf("Offer = %+v, stats %+v", d, tr.Stats())
	}
}

func TestPinnedStateIsNeverEvictedAndNewStateGoesUntracked(t *testing.T) {
	// Given one producer slot, held by a producer with a chunk in flight
	tr, _ := newTracker(Config{MaxProducers: 1})
	tr.Offer(at("A", 1, 0, 1))
	// When another producer's chunk arrives
	d := tr.Offer(at("B", 1, 0, 2))
	// Then it is forwarded untracked, and A still waits for its receipt
	if d != (Decision{Action: Forward, Rule: RuleUntracked}) || tr.Stats().InFlight != 1 {
		t.Errorf("Offer = %+v, stats %+v", d, tr.Stats())
	}
}

func TestTooManyWaitersRejects(t *testing.T) {
	// Given one allowed waiter, already taken
	tr, _ := newTracker(Config{MaxWaiters: 1})
	tr.Offer(ck(1, 0, 1))
	tr.Offer(ck(1, 0, 2))
	// When a third copy arrives
	d := tr.Offer(ck(1, 0, 3))
	// Then it is rejected
	if d != (Decision{Action: Reject, Rule: RuleWaitersFull}) {
		t.Errorf("Offer = %+v", d)
	}
}

func TestStatsCountDuplicatesByRule(t *testing.T) {
	// Given a persisted chunk, an in-flight chunk, and a copy of each
	tr, _ := newTracker(Config{})
	forwardAndPersist(t, tr, ck(1, 0, 1), 1)
	tr.Offer(ck(1, 1, 2))
	tr.Offer(ck(1, 0, 3))
	// When a copy of the in-flight chunk arrives
	tr.Offer(ck(1, 1, 4))
	// Then each rule counted its decisions
	s := tr.Stats()
	if s.Decisions[RuleFirstCopy] != 2 || s.Decisions[RulePersisted] != 1 || s.Decisions[RuleInFlight] != 1 {
		t.Errorf("Decisions = %v", s.Decisions)
	}
}

func TestTwoProducersInterleaved(t *testing.T) {
	// Given two producers whose chunks interleave, A's chunk 1 in flight
	tr, _ := newTracker(Config{})
	forwardAndPersist(t, tr, at("A", 1, 0, 1), 10)
	forwardAndPersist(t, tr, at("B", 1, 0, 2), 20)
	tr.Offer(at("A", 1, 1, 3))
	forwardAndPersist(t, tr, at("B", 1, 1, 4), 21)
	// When both resend chunks 0 and 1
	got := []Decision{tr.Offer(at("A", 1, 0, 5)), tr.Offer(at("B", 1, 0, 6)), tr.Offer(at("A", 1, 1, 7)), tr.Offer(at("B", 1, 1, 8))}
	// Then each gets its own stored position or waits for its own original
	want := []Decision{
		{Action: AnswerNow, Rule: RulePersisted, Ledger: 7, Entry: 10},
		{Action: AnswerNow, Rule: RulePersisted, Ledger: 7, Entry: 20},
		{Action: AnswerWhenPersisted, Rule: RuleInFlight, WaitFor: 3},
		{Action: AnswerNow, Rule: RulePersisted, Ledger: 7, Entry: 21},
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("decision %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestRuleNames(t *testing.T) {
	seen := map[string]bool{}
	for r := range NumRules {
		n := Rule(r).String()
		if n == "" || n == "unknown" || seen[n] {
			t.Errorf("rule %d has name %q", r, n)
		}
		seen[n] = true
	}
}

func BenchmarkOfferPersistCycle(b *testing.B) {
	tr, _ := newTracker(Config{})
	b.ReportAllocs()
	var tok Token
	for b.Loop() {
		tok++
		seq := uint64(tok / 4)
		c := Chunk{Topic: "persistent://a/b/t", Producer: "p", SequenceID: seq, ChunkID: int(tok % 4), NumChunks: 4,
			Fingerprint: uint64(tok), Token: tok}
		tr.Offer(c)
		tr.Persisted(tok, 1, uint64(tok))
	}
}
