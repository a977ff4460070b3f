package chunkdedup

import "testing"

// stored is chunk id of the 4-chunk message seq as the topic holds it, at 9:entry.
func stored(seq uint64, id int, entry uint64) Stored {
	return Stored{SequenceID: seq, ChunkID: id, NumChunks: 4, Fingerprint: fp(seq, id, 0), Ledger: 9, Entry: entry}
}

// An instance that has no record of a producer learns what the topic stores before the
// producer's resent chunks are offered: each resent copy of a stored chunk is answered with
// the stored position, every other chunk is forwarded.
func TestLearnedChunksAnswerTheirResentCopies(t *testing.T) {
	tests := []struct {
		name    string
		learned []Stored
		when    Chunk
		want    Decision
	}{
		{"a resent copy of a stored middle chunk gets its position",
			[]Stored{stored(5, 0, 10), stored(5, 1, 11)}, ck(5, 1, 1),
			Decision{Action: AnswerNow, Rule: RulePersisted, Ledger: 9, Entry: 11}},
		{"a chunk the topic does not hold is forwarded",
			[]Stored{stored(5, 0, 10), stored(5, 1, 11)}, ck(5, 2, 1),
			Decision{Action: Forward, Rule: RuleFirstCopy}},
		{"a later message's stored chunk is answered too",
			[]Stored{stored(5, 3, 13), stored(6, 0, 14)}, ck(6, 0, 1),
			Decision{Action: AnswerNow, Rule: RulePersisted, Ledger: 9, Entry: 14}},
		{"same sequence id with other bytes (a restarted producer) is forwarded",
			[]Stored{stored(5, 0, 10)}, func() Chunk { c := ck(5, 0, 1); c.Fingerprint = fp(5, 0, 1); return c }(),
			Decision{Action: Forward, Rule: RuleRestarted}},
		{"nothing stored: the chunk is forwarded",
			nil, ck(5, 0, 1), Decision{Action: Forward, Rule: RuleFirstCopy}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, _ := newTracker(Config{})
			tr.Learn(tt.when.Topic, tt.when.Producer, tt.learned)
			if got := tr.Offer(tt.when); got != tt.want {
				t.Fatalf("Offer = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// Learn never overrides what this instance knows itself, and records nothing it cannot use.
func TestLearnSkipsWhatItCannotUse(t *testing.T) {
	tr, _ := newTracker(Config{})
	tr.Offer(ck(5, 0, 1)) // in flight here
	got := tr.Learn("persistent://a/b/t", "p", []Stored{
		stored(5, 0, 10), // in flight here: kept
		{SequenceID: 5, ChunkID: 1, NumChunks: 3, Fingerprint: 1, Ledger: 9, Entry: 11},            // other chunk count
		{SequenceID: 6, ChunkID: 4, NumChunks: 4, Ledger: 9, Entry: 12},                            // chunk id out of range
		{SequenceID: 6, ChunkID: 0, NumChunks: 1, Ledger: 9, Entry: 13},                            // not a chunk
		{SequenceID: 6, ChunkID: 1, NumChunks: 4, Ledger: UnknownPosition, Entry: UnknownPosition}, // no position
	})
	if got != 0 {
		t.Fatalf("Learn recorded %d chunks, want 0", got)
	}
	if d := tr.Offer(ck(5, 0, 2)); d.Action != AnswerWhenPersisted {
		t.Fatalf("copy of the chunk in flight here: %+v, want AnswerWhenPersisted", d)
	}
}

// Learning about a producer creates its record even when the topic holds nothing of it, so the
// caller looks only once; the record obeys the bounds like any other.
func TestLearnCreatesTheRecordAndKeepsTheBounds(t *testing.T) {
	tr, _ := newTracker(Config{MaxTrackedChunks: 8})
	if tr.Known("persistent://a/b/t", "p") {
		t.Fatal("known before anything was offered or learned")
	}
	tr.Learn("persistent://a/b/t", "p", nil)
	if !tr.Known("persistent://a/b/t", "p") {
		t.Fatal("not known after Learn")
	}
	var all []Stored
	for seq := uint64(1); seq <= 4; seq++ {
		for id := range 4 {
			all = append(all, stored(seq, id, seq*10+uint64(id)))
		}
	}
	tr.Learn("persistent://a/b/t", "p", all)
	if s := tr.Stats(); s.TrackedChunks > 8 {
		t.Fatalf("%d chunk slots tracked, bound 8", s.TrackedChunks)
	}
	if d := tr.Offer(ck(4, 3, 1)); d.Action != AnswerNow || d.Entry != 43 {
		t.Fatalf("newest learned chunk: %+v, want AnswerNow at 9:43", d)
	}
}
