package chunkdedup

import (
	"container/list"
	"sync"
	"time"
)

// Token identifies one client send of one chunk. The caller chooses it (its
// own pending-send id, say); it must be unique among the tracker's
// outstanding tokens, that is until Persisted, Failed or Cancel retires it.
type Token uint64

// UnknownPosition is the ledger and entry id the broker puts in a receipt for
// a message it judged a duplicate (-1 on the wire, as uint64).
const UnknownPosition = ^uint64(0)

// Chunk is one chunk a client sent, reduced to the values the rules need.
type Chunk struct {
	Topic    string // full topic name, partition included: partitions are separate topics
	Producer string // the producer name the client registered (CommandProducer)
	// SequenceID is CommandSend.sequence_id; every chunk of a message shares it.
	SequenceID uint64
	ChunkID    int // MessageMetadata.chunk_id, 0 .. NumChunks-1
	NumChunks  int // MessageMetadata.num_chunks_from_msg, >= 2
	// Fingerprint identifies the chunk's bytes, for instance CRC32C over the
	// payload and the message's publish time, as sent. A client resends the
	// very same bytes, so an equal (sequence id, chunk id) with a different
	// fingerprint is a different message: a producer restarted and reused the
	// sequence id. Compute it from values a stored entry still carries when
	// read back, so that Learn's Stored chunks compare with offered ones.
	Fingerprint uint64
	Token       Token
}

// Action is what the caller must do with an offered chunk.
type Action uint8

const (
	// Forward: send the chunk to the broker unchanged, then report its fate
	// with Persisted or Failed.
	Forward Action = iota
	// AnswerNow: do not forward; answer the client with a receipt carrying
	// Decision.Ledger and Decision.Entry, the stored copy's position.
	AnswerNow
	// AnswerWhenPersisted: do not forward; the answer comes from Persisted
	// (or, if the original fails, Failed promotes this chunk to be forwarded).
	AnswerWhenPersisted
	// Reject: too many duplicates are waiting; answer the client with a send
	// error so that it reconnects and resends later.
	Reject
)

// Rule says why a decision was taken; Stats counts decisions per rule.
type Rule uint8

const (
	// RuleFirstCopy: forwarded, no copy of this chunk is known.
	RuleFirstCopy Rule = iota
	// RuleForgotten: forwarded; the chunk is at or below the persisted mark
	// but its stored position is no longer (or was never) remembered, and
	// answering without it would invent a message id.
	RuleForgotten
	// RuleRestarted: forwarded; the remembered message with this sequence id
	// had other content, so the producer reused the id. The old record is
	// dropped.
	RuleRestarted
	// RuleUntracked: forwarded without tracking: invalid chunk fields, a
	// reused token, or no room within the configured bounds.
	RuleUntracked
	// RulePersisted: duplicate of a persisted chunk, answered now.
	RulePersisted
	// RuleInFlight: duplicate of a chunk still in flight, answered later.
	RuleInFlight
	// RuleWaitersFull: duplicate of an in-flight chunk, rejected because
	// MaxWaiters duplicates already wait.
	RuleWaitersFull

	// NumRules is the number of rules, for iterating over Stats.Decisions.
	NumRules = int(RuleWaitersFull) + 1
)

var ruleNames = [NumRules]string{
	"first_copy", "forgotten", "restarted", "untracked", "persisted", "in_flight", "waiters_full",
}

// String returns a metric-label-friendly name.
func (r Rule) String() string {
	if int(r) < NumRules {
		return ruleNames[r]
	}
	return "unknown"
}

// Decision is the tracker's answer to Offer.
type Decision struct {
	Action Action
	Rule   Rule
	// Ledger and Entry are the stored copy's position, for AnswerNow.
	Ledger, Entry uint64
	// WaitFor is the in-flight original's token, for AnswerWhenPersisted.
	WaitFor Token
}

// Answer tells the caller to answer the client send Token with a receipt at
// Ledger:Entry.
type Answer struct {
	Token         Token
	Ledger, Entry uint64
}

// Position is a (sequence id, chunk id) pair.
type Position struct {
	SequenceID uint64
	ChunkID    int
}

// Marks are a producer's watermarks, for diagnostics and tests.
type Marks struct {
	// Forwarded is the chunk most recently forwarded.
	Forwarded    Position
	HasForwarded bool
	// Persisted is the chunk whose receipt (with a real position) arrived last.
	Persisted    Position
	HasPersisted bool
}

// Stats are counters since creation plus current sizes.
type Stats struct {
	// Decisions counts Offer results by Rule. Duplicates dropped are
	// Decisions[RulePersisted] + Decisions[RuleInFlight].
	Decisions [NumRules]uint64

	PersistedEvents uint64 // Persisted calls for known tokens
	FailedEvents    uint64 // Failed calls for known tokens
	Promotions      uint64 // waiting duplicates promoted to be forwarded
	Cancelled       uint64 // waiting duplicates withdrawn
	EvictedLRU      uint64 // producers dropped to make room
	EvictedTTL      uint64 // producers dropped after TTL idle
	MessagesDropped uint64 // message records dropped from a producer's window
	Learned         uint64 // stored chunks recorded by Learn

	Producers     int // producers tracked now
	TrackedChunks int // chunk slots allocated now
	InFlight      int // forwarded chunks awaiting Persisted or Failed
	Waiters       int // duplicates awaiting their original
}

// Tracker is the duplicate-chunk state of one proxy process. All methods may
// be called from any goroutine: an internal mutex serializes them, and no
// method blocks or does I/O while holding it.
type Tracker struct {
	mu  sync.Mutex
	cfg Config

	producers map[producerKey]*producer
	// lru holds the producers that may be evicted (no chunk in flight, no
	// waiter), most recently used at the front. Pinned producers are kept
	// out of it, so eviction never has to skip over them.
	lru list.List

	pending map[Token]*pendingRef
	// waiters maps an in-flight original's token to the duplicates waiting
	// for it, in arrival order.
	waiters map[Token][]Token

	nChunks, nInFlight, nWaiters int
	stats                        Stats
}

type producerKey struct{ topic, producer string }

type producer struct {
	key      producerKey
	msgs     []*message // oldest first
	lastSeen time.Time
	elem     *list.Element // non-nil while in Tracker.lru
	pins     int           // in-flight originals and waiters of this producer
	marks    Marks
}

type message struct {
	seq       uint64
	numChunks int
	pins      int
	chunks    []chunkSlot
}

type slotState uint8

const (
	unseen slotState = iota
	inFlight
	persisted
)

type chunkSlot struct {
	state         slotState
	fingerprint   uint64
	token         Token  // the original's, while inFlight
	ledger, entry uint64 // while persisted
}

type pendingRef struct {
	p        *producer
	m        *message
	chunk    int
	waiter   bool
	original Token // for a waiter: whom it waits for
}

// New returns an empty tracker. Zero fields of cfg take their defaults.
// Any goroutine may call it.
func New(cfg Config) *Tracker {
	t := &Tracker{
		cfg:       cfg.withDefaults(),
		producers: make(map[producerKey]*producer),
		pending:   make(map[Token]*pendingRef),
		waiters:   make(map[Token][]Token),
	}
	t.lru.Init()
	return t
}

// Offer decides what to do with a chunk a client sent. Any goroutine may call
// it.
func (t *Tracker) Offer(c Chunk) Decision {
	t.mu.Lock()
	defer t.mu.Unlock()
	d := t.offer(c)
	t.stats.Decisions[d.Rule]++
	return d
}

func (t *Tracker) offer(c Chunk) Decision {
	now := t.cfg.Now()
	t.expire(now)
	untracked := Decision{Action: Forward, Rule: RuleUntracked}
	if c.NumChunks < 2 || c.ChunkID < 0 || c.ChunkID >= c.NumChunks {
		return untracked
	}
	if _, reused := t.pending[c.Token]; reused {
		return untracked
	}
	key := producerKey{c.Topic, c.Producer}
	p := t.producers[key]
	if p == nil {
		if !t.admitProducer() {
			return untracked
		}
		p = &producer{key: key}
		t.producers[key] = p
		p.elem = t.lru.PushFront(p)
	}
	t.touch(p, now)

	rule := RuleFirstCopy
	m := p.find(c.SequenceID)
	if m != nil && !m.holds(c) {
		// Same sequence id, other content: the producer restarted and reused
		// the id. The old record cannot be dropped while its fate is pending.
		if m.pins > 0 {
			return untracked
		}
		t.dropMessage(p, m)
		m, rule = nil, RuleRestarted
	}
	if m == nil {
		if rule == RuleFirstCopy && p.marks.HasPersisted && !p.marks.Persisted.less(Position{c.SequenceID, c.ChunkID}) {
			rule = RuleForgotten
		}
		if m = t.newMessage(p, c); m == nil {
			return untracked
		}
	}

	s := &m.chunks[c.ChunkID]
	switch s.state {
	case persisted:
		return Decision{Action: AnswerNow, Rule: RulePersisted, Ledger: s.ledger, Entry: s.entry}
	case inFlight:
		if t.nWaiters >= t.cfg.MaxWaiters {
			return Decision{Action: Reject, Rule: RuleWaitersFull}
		}
		t.waiters[s.token] = append(t.waiters[s.token], c.Token)
		t.pending[c.Token] = &pendingRef{p: p, m: m, chunk: c.ChunkID, waiter: true, original: s.token}
		t.nWaiters++
		t.pin(p, m, 1)
		return Decision{Action: AnswerWhenPersisted, Rule: RuleInFlight, WaitFor: s.token}
	}
	*s = chunkSlot{state: inFlight, fingerprint: c.Fingerprint, token: c.Token}
	t.pending[c.Token] = &pendingRef{p: p, m: m, chunk: c.ChunkID}
	t.nInFlight++
	t.pin(p, m, 1)
	p.marks.Forwarded, p.marks.HasForwarded = Position{c.SequenceID, c.ChunkID}, true
	return Decision{Action: Forward, Rule: rule}
}

// Persisted reports the broker's receipt for a forwarded chunk and returns the
// waiting duplicates to answer, each with the same position. A position of
// UnknownPosition (the broker's own duplicate answer) is relayed to waiters
// but not remembered, so a later resend is forwarded and the broker answers it
// again: the tracker never makes up a -1:-1. Unknown tokens return nil.
// Any goroutine may call it.
func (t *Tracker) Persisted(tok Token, ledger, entry uint64) []Answer {
	t.mu.Lock()
	defer t.mu.Unlock()
	ref, ok := t.pending[tok]
	if !ok || ref.waiter {
		return nil
	}
	t.stats.PersistedEvents++
	delete(t.pending, tok)
	t.nInFlight--
	ws := t.waiters[tok]
	delete(t.waiters, tok)
	var answers []Answer
	if len(ws) > 0 {
		answers = make([]Answer, len(ws))
		for i, w := range ws {
			delete(t.pending, w)
			answers[i] = Answer{Token: w, Ledger: ledger, Entry: entry}
		}
		t.nWaiters -= len(ws)
	}
	s := &ref.m.chunks[ref.chunk]
	if ledger == UnknownPosition && entry == UnknownPosition {
		*s = chunkSlot{}
	} else {
		*s = chunkSlot{state: persisted, fingerprint: s.fingerprint, ledger: ledger, entry: entry}
		ref.p.marks.Persisted, ref.p.marks.HasPersisted = Position{ref.m.seq, ref.chunk}, true
	}
	t.pin(ref.p, ref.m, -(1 + len(ws)))
	t.touch(ref.p, t.cfg.Now())
	return answers
}

// Failed reports that a forwarded chunk was not persisted: the broker sent a
// SendError for it, or the broker connection closed before its receipt. The
// chunk is not recorded as persisted. If duplicates were waiting for it, the
// first is promoted: the caller must now forward that send (and later report
// its fate), and the other waiters wait for it. Unknown tokens return false.
// Any goroutine may call it.
func (t *Tracker) Failed(tok Token) (promoted Token, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ref, known := t.pending[tok]
	if !known || ref.waiter {
		return 0, false
	}
	t.stats.FailedEvents++
	delete(t.pending, tok)
	ws := t.waiters[tok]
	delete(t.waiters, tok)
	s := &ref.m.chunks[ref.chunk]
	t.touch(ref.p, t.cfg.Now())
	if len(ws) == 0 {
		*s = chunkSlot{}
		t.nInFlight--
		t.pin(ref.p, ref.m, -1)
		return 0, false
	}
	// The first waiter becomes the in-flight original; it carries the same
	// fingerprint, or it would not have been made a waiter.
	promoted, rest := ws[0], ws[1:]
	s.token = promoted
	t.pending[promoted] = &pendingRef{p: ref.p, m: ref.m, chunk: ref.chunk}
	for _, w := range rest {
		t.pending[w].original = promoted
	}
	if len(rest) > 0 {
		t.waiters[promoted] = rest
	}
	t.nWaiters--
	t.stats.Promotions++
	t.pin(ref.p, ref.m, -1)
	return promoted, true
}

// Cancel withdraws a waiting duplicate, for instance because its client
// connection closed. It returns false for any other token: a forwarded chunk's
// fate must still be reported with Persisted or Failed. Any goroutine may call
// it.
func (t *Tracker) Cancel(tok Token) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	ref, ok := t.pending[tok]
	if !ok || !ref.waiter {
		return false
	}
	delete(t.pending, tok)
	ws := t.waiters[ref.original]
	for i, w := range ws {
		if w == tok {
			ws = append(ws[:i:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(t.waiters, ref.original)
	} else {
		t.waiters[ref.original] = ws
	}
	t.nWaiters--
	t.stats.Cancelled++
	t.pin(ref.p, ref.m, -1)
	return true
}

// Expire drops producers idle for longer than the TTL now, rather than at the
// next Offer, and returns how many it dropped. Producers with a chunk in
// flight or a waiter are never dropped. Any goroutine may call it.
func (t *Tracker) Expire() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.expire(t.cfg.Now())
}

// Marks returns a producer's watermarks. Any goroutine may call it.
func (t *Tracker) Marks(topic, producerName string) (Marks, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.producers[producerKey{topic, producerName}]
	if !ok {
		return Marks{}, false
	}
	return p.marks, true
}

// Stats returns a snapshot of the counters and sizes. Any goroutine may call
// it.
func (t *Tracker) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.stats
	s.Producers, s.TrackedChunks, s.InFlight, s.Waiters = len(t.producers), t.nChunks, t.nInFlight, t.nWaiters
	return s
}

func (a Position) less(b Position) bool {
	return a.SequenceID < b.SequenceID || (a.SequenceID == b.SequenceID && a.ChunkID < b.ChunkID)
}

// holds reports whether c can be a chunk of m: same chunk count, and the same
// bytes as the copy of that chunk already seen, if any.
func (m *message) holds(c Chunk) bool {
	if m.numChunks != c.NumChunks {
		return false
	}
	s := &m.chunks[c.ChunkID]
	return s.state == unseen || s.fingerprint == c.Fingerprint
}

func (p *producer) find(seq uint64) *message {
	for i := len(p.msgs) - 1; i >= 0; i-- {
		if p.msgs[i].seq == seq {
			return p.msgs[i]
		}
	}
	return nil
}

func (t *Tracker) touch(p *producer, now time.Time) {
	p.lastSeen = now
	if p.elem != nil {
		t.lru.MoveToFront(p.elem)
	}
}

// pin adjusts the pin counts; a producer leaves the LRU while pinned and
// returns to its front, as most recently used, when the last pin goes.
func (t *Tracker) pin(p *producer, m *message, delta int) {
	m.pins += delta
	was := p.pins
	p.pins += delta
	switch {
	case was == 0 && p.pins > 0:
		t.lru.Remove(p.elem)
		p.elem = nil
	case was > 0 && p.pins == 0:
		p.elem = t.lru.PushFront(p)
	}
}

func (t *Tracker) expire(now time.Time) int {
	n := 0
	for e := t.lru.Back(); e != nil; e = t.lru.Back() {
		p := e.Value.(*producer)
		if now.Sub(p.lastSeen) < t.cfg.TTL {
			break
		}
		t.evict(p)
		t.stats.EvictedTTL++
		n++
	}
	return n
}

func (t *Tracker) evict(p *producer) {
	t.lru.Remove(p.elem)
	p.elem = nil
	for _, m := range p.msgs {
		t.nChunks -= len(m.chunks)
	}
	p.msgs = nil
	delete(t.producers, p.key)
}

// evictOther drops the least recently used evictable producer other than
// keep; it reports whether there was one.
func (t *Tracker) evictOther(keep *producer) bool {
	for e := t.lru.Back(); e != nil; e = e.Prev() {
		if p := e.Value.(*producer); p != keep {
			t.evict(p)
			t.stats.EvictedLRU++
			return true
		}
	}
	return false
}

func (t *Tracker) admitProducer() bool {
	return len(t.producers) < t.cfg.MaxProducers || t.evictOther(nil)
}

func (t *Tracker) dropMessage(p *producer, m *message) {
	for i, x := range p.msgs {
		if x == m {
			p.msgs = append(p.msgs[:i], p.msgs[i+1:]...)
			break
		}
	}
	t.nChunks -= len(m.chunks)
	t.stats.MessagesDropped++
}

// dropOldest drops p's oldest message with nothing pending.
func (t *Tracker) dropOldest(p *producer) bool {
	for _, m := range p.msgs {
		if m.pins == 0 {
			t.dropMessage(p, m)
			return true
		}
	}
	return false
}

// newMessage makes room within the bounds and records a message, or returns
// nil when everything that could make room is pinned.
func (t *Tracker) newMessage(p *producer, c Chunk) *message {
	if c.NumChunks > t.cfg.MaxChunksPerMessage {
		return nil
	}
	if len(p.msgs) >= t.cfg.MaxMessagesPerProducer && !t.dropOldest(p) {
		return nil
	}
	for t.nChunks+c.NumChunks > t.cfg.MaxTrackedChunks {
		if !t.evictOther(p) && !t.dropOldest(p) {
			return nil
		}
	}
	m := &message{seq: c.SequenceID, numChunks: c.NumChunks, chunks: make([]chunkSlot, c.NumChunks)}
	p.msgs = append(p.msgs, m)
	t.nChunks += c.NumChunks
	return m
}

// Stored is a chunk the topic already holds, read back from the broker by a
// proxy instance that has no record of its producer (see "Recovery" in the
// package doc). Its Fingerprint must be computed the way the caller computes
// Chunk.Fingerprint, from values the stored entry still carries.
type Stored struct {
	SequenceID    uint64
	ChunkID       int
	NumChunks     int
	Fingerprint   uint64
	Ledger, Entry uint64
}

// Known reports whether the tracker holds a record of the producer: a
// caller that may have to recover what another instance stored asks this
// before offering the producer's first chunk. Any goroutine may call it.
func (t *Tracker) Known(topic, producerName string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.producers[producerKey{topic, producerName}]
	return ok
}

// Learn records chunks the topic already stores for the producer, as if
// their receipts had arrived here, so that the copies a resuming client
// resends are answered with the stored positions (RulePersisted) instead of
// being stored twice. It creates the producer's record even when stored is
// empty: what the topic holds has been looked at. A chunk whose slot is
// already known (in flight or persisted here), whose message is remembered
// with another chunk count, or that does not fit within the bounds is
// skipped; Learn returns how many it recorded. Give stored oldest first.
// Any goroutine may call it.
func (t *Tracker) Learn(topic, producerName string, stored []Stored) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.cfg.Now()
	t.expire(now)
	key := producerKey{topic, producerName}
	p := t.producers[key]
	if p == nil {
		if !t.admitProducer() {
			return 0
		}
		p = &producer{key: key}
		t.producers[key] = p
		p.elem = t.lru.PushFront(p)
	}
	t.touch(p, now)
	n := 0
	for _, s := range stored {
		if s.NumChunks < 2 || s.ChunkID < 0 || s.ChunkID >= s.NumChunks ||
			(s.Ledger == UnknownPosition && s.Entry == UnknownPosition) {
			continue
		}
		m := p.find(s.SequenceID)
		if m == nil {
			if m = t.newMessage(p, Chunk{SequenceID: s.SequenceID, NumChunks: s.NumChunks}); m == nil {
				continue
			}
		}
		if m.numChunks != s.NumChunks || m.chunks[s.ChunkID].state != unseen {
			continue
		}
		m.chunks[s.ChunkID] = chunkSlot{state: persisted, fingerprint: s.Fingerprint, ledger: s.Ledger, entry: s.Entry}
		if pos := (Position{s.SequenceID, s.ChunkID}); !p.marks.HasPersisted || p.marks.Persisted.less(pos) {
			p.marks.Persisted, p.marks.HasPersisted = pos, true
		}
		t.stats.Learned++
		n++
	}
	return n
}
