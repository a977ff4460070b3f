package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/rebatchproxy/rebatchproxy/chunkdedup"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// The look at what another instance stored: a producer that reconnects to an instance with
// no record of it resends chunks the topic may already hold; the instance reads the topic
// back first, answers the copies of stored chunks with their positions and forwards the rest.

// storedTopic is a StoredReader over a fixed set of stored chunks; it records the looks made.
type storedTopic struct {
	stored []chunkdedup.Stored
	err    error
	looks  chan uint64 // fromSeq of each look
}

func (s *storedTopic) ReadStored(_ context.Context, topic, producer string, fromSeq uint64) ([]chunkdedup.Stored, int, error) {
	s.looks <- fromSeq
	return s.stored, len(s.stored), s.err
}

// storedChunk is chunk id of chunkFrame's message as the topic holds it, at 9:(10+id).
func storedChunk(id int) chunkdedup.Stored {
	return chunkdedup.Stored{SequenceID: 5, ChunkID: id, NumChunks: 3, Ledger: 9, Entry: uint64(10 + id),
		Fingerprint: ChunkFingerprint(make([]byte, 100), 1, "p-5")}
}

// tickUntil ticks p until cond holds, for at most 5 s (the look runs on its own goroutine).
func tickUntil(t *testing.T, p ProducerPath, out Outputs, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5 s of ticks")
		}
		if err := p.Tick(time.Now(), out); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
}

func receiptsFor(cmds []*pulsarpb.BaseCommand, seq uint64) []string {
	var ids []string
	for _, c := range cmds {
		if c.GetType() == pulsarpb.BaseCommand_SEND_RECEIPT && c.GetSendReceipt().GetSequenceId() == seq {
			m := c.GetSendReceipt().GetMessageId()
			ids = append(ids, fmt.Sprintf("%d:%d", m.GetLedgerId(), m.GetEntryId()))
		}
	}
	return ids
}

// Given a topic that stores chunks 0 and 1 of message 5 (sent through another instance, or
// through this one before it restarted) and an instance with no record of producer "p",
// when "p", reconnected, resends chunks 0, 1 and 2 on a new connection,
// then the instance looks at the topic once, from sequence id 5, forwards chunk 2 alone, and
// the client's receipts for chunks 0 and 1 carry the stored positions, in the client's order.
func TestResumedChunksAlreadyStoredAreAnsweredFromTheTopic(t *testing.T) {
	cd := NewChunkDedup(chunkdedup.Config{})
	topic := &storedTopic{stored: []chunkdedup.Stored{storedChunk(0), storedChunk(1)}, looks: make(chan uint64, 4)}
	cd.EnableRecovery(topic, slog.New(slog.NewTextHandler(io.Discard, nil)))
	cur, _ := chunkPath(t, cd, 1)
	out := &rawOut{t: t}

	for id := int32(0); id < 3; id++ {
		if _, err := cur.FromClient(chunkFrame(t, id), out); err != nil {
			t.Fatal(err)
		}
	}
	tickUntil(t, cur, out, func() bool { return len(sentChunkIDs(t, out.broker)) > 0 })

	if got := sentChunkIDs(t, out.broker); len(got) != 1 || got[0] != 2 {
		t.Fatalf("broker got chunks %v, want [2]", got)
	}
	if from := <-topic.looks; from != 5 || len(topic.looks) != 0 {
		t.Fatalf("looked from sequence id %d (%d more looks), want one look from 5", from, len(topic.looks))
	}
	if _, err := cur.FromBroker(receiptFrame(t, 5, 9, 12), out); err != nil {
		t.Fatal(err)
	}
	if got := receiptsFor(out.client, 5); len(got) != 3 || got[0] != "9:10" || got[1] != "9:11" || got[2] != "9:12" {
		t.Fatalf("client receipts %v, want [9:10 9:11 9:12] (stored positions, then the broker's)", got)
	}
}

// Given a topic the instance cannot read (the admin API refuses, or the look times out),
// when a reconnected producer resends chunks,
// then they are all forwarded, as without the proxy: a duplicate at worst, never a chunk
// answered without a stored copy.
func TestAFailedLookForwardsEverything(t *testing.T) {
	cd := NewChunkDedup(chunkdedup.Config{})
	topic := &storedTopic{err: errors.New("HTTP 401"), looks: make(chan uint64, 4)}
	cd.EnableRecovery(topic, slog.New(slog.NewTextHandler(io.Discard, nil)))
	cur, _ := chunkPath(t, cd, 1)
	out := &rawOut{t: t}

	for id := int32(0); id < 3; id++ {
		if _, err := cur.FromClient(chunkFrame(t, id), out); err != nil {
			t.Fatal(err)
		}
	}
	tickUntil(t, cur, out, func() bool { return len(sentChunkIDs(t, out.broker)) == 3 })

	if got := sentChunkIDs(t, out.broker); got[0] != 0 || got[1] != 1 || got[2] != 2 {
		t.Fatalf("broker got chunks %v, want [0 1 2]", got)
	}
	if n := len(receiptsFor(out.client, 5)); n != 0 {
		t.Fatalf("client got %d receipts before the broker answered, want 0", n)
	}
}

// Given a reconnected producer whose chunk waits for the look,
// when its connection closes before the look ends,
// then the chunk is withdrawn: nothing is forwarded for it later and the tracker keeps no
// chunk in flight for it.
func TestAChunkWithdrawnDuringTheLookLeavesNothingInFlight(t *testing.T) {
	cd := NewChunkDedup(chunkdedup.Config{})
	release := make(chan struct{})
	topic := &blockingTopic{release: release}
	cd.EnableRecovery(topic, slog.New(slog.NewTextHandler(io.Discard, nil)))
	cur, _ := chunkPath(t, cd, 1)
	out := &rawOut{t: t}
	if _, err := cur.FromClient(chunkFrame(t, 0), out); err != nil {
		t.Fatal(err)
	}

	cur.Close()

	close(release)
	deadline := time.Now().Add(5 * time.Second)
	for cd.lookInProgress() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if s := cd.Stats(); s.InFlight != 0 || s.Waiters != 0 {
		t.Fatalf("tracker: %d in flight, %d waiting after the connection closed, want 0 and 0", s.InFlight, s.Waiters)
	}
	if got := sentChunkIDs(t, out.broker); len(got) != 0 {
		t.Fatalf("broker got chunks %v from a closed connection", got)
	}
}

type blockingTopic struct{ release chan struct{} }

func (b *blockingTopic) ReadStored(context.Context, string, string, uint64) ([]chunkdedup.Stored, int, error) {
	<-b.release
	return nil, 0, nil
}
