package proxy

import (
	"context"
	"encoding/binary"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rebatchproxy/rebatchproxy/chunkdedup"
	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// Recovering what another instance stored (chunkdedup's "Recovery"): when a producer that
// may be resuming (mayBeResuming) sends its first chunk on a connection, the chunk, and
// what the producer sends after it, are held while a StoredReader reads the topic's newest
// entries through the brokers; what it finds is learned by the tracker, and the held chunks
// are then offered as usual: a copy of a stored chunk is answered with the stored position,
// anything else forwarded. This instance's own record is not enough: the client may have
// sent through another instance since. The look happens once per reconnect of a chunking
// producer, costs at most the reader's bounds, and every failure (unreachable broker,
// timeout, no permission) ends in forwarding, which is the broker's behaviour without the
// proxy: a duplicate at worst, never a lost chunk.

// StoredReader reads back the chunks a topic stores for a producer, newest entries first,
// down to the first entry of that producer with a sequence id below fromSeq, within its own
// bounds and ctx. It returns what it found oldest first, how many entries it read, and an
// error when it stopped early; what was found before the error is still returned. Any
// goroutine may call it.
type StoredReader interface {
	ReadStored(ctx context.Context, topic, producer string, fromSeq uint64) ([]chunkdedup.Stored, int, error)
}

// ChunkFingerprint is the fingerprint of a chunk for duplicate-chunk removal, computed from
// values a stored entry still carries when read back (its payload, publish time and uuid),
// so that a chunk sent to this instance and one read from the topic compare. A client
// resends the very same bytes; a restarted producer reusing a sequence id has another
// publish time or payload. Any goroutine may call it.
func ChunkFingerprint(payload []byte, publishTime uint64, uuid string) uint64 {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], publishTime)
	meta := wire.UpdateCRC32C(wire.CRC32C(b[:]), []byte(uuid))
	return uint64(wire.CRC32C(payload))<<32 | uint64(meta)
}

// recovery is one look at a topic in progress; chunks offered meanwhile wait in it.
type recovery struct {
	waiting []chunkdedup.Chunk
}

// recoveryTimeout bounds one look, reads and retries included.
const recoveryTimeout = 10 * time.Second

// EnableRecovery makes the proxy look at what the topic stores before it forwards the
// chunks of a resuming producer it has no record of (see above). Call it before the server
// starts. Any goroutine may call it.
func (c *ChunkDedup) EnableRecovery(r StoredReader, log *slog.Logger) {
	c.reader, c.log = r, log
}

// canLook reports whether chunks of the topic can be looked for: a reader is set and the
// topic keeps what it stores. Called on event loops.
func (c *ChunkDedup) canLook(topic string) bool {
	return c.reader != nil && strings.HasPrefix(topic, "persistent://")
}

type producerKey struct{ topic, producer string }

// recover holds ch until the topic has been looked at, starting the look unless one is in
// progress for its producer. The chunk's outcome arrives through the mailbox, like a held
// duplicate's: an answer, or a promotion (forward it). Called on event loops.
func (c *ChunkDedup) recover(ch chunkdedup.Chunk) {
	key := producerKey{ch.Topic, ch.Producer}
	c.mu.Lock()
	if rec, busy := c.recovering[key]; busy {
		rec.waiting = append(rec.waiting, ch)
		c.mu.Unlock()
		return
	}
	rec := &recovery{waiting: []chunkdedup.Chunk{ch}}
	c.recovering[key] = rec
	c.mu.Unlock()
	go c.look(key, ch.SequenceID, rec)
}

// look reads the topic, teaches the tracker, and settles the chunks that waited. It runs on
// its own goroutine.
func (c *ChunkDedup) look(key producerKey, fromSeq uint64, rec *recovery) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), recoveryTimeout)
	stored, read, err := c.reader.ReadStored(ctx, key.topic, key.producer, fromSeq)
	cancel()
	learned := c.t.Learn(key.topic, key.producer, stored)
	outcome := "found"
	switch {
	case err != nil:
		outcome = "failed"
	case learned == 0:
		outcome = "nothing_stored"
	}
	c.recoveries.WithLabelValues(outcome).Inc()
	c.recoveryEntries.Add(float64(read))
	// Settle under c.mu, so that a connection withdrawing a waiting chunk (cancel) finds it
	// either still waiting here or with its outcome in the mailbox.
	c.mu.Lock()
	delete(c.recovering, key)
	waiting := rec.waiting
	for _, ch := range waiting {
		d := c.t.Offer(ch)
		c.decisions.WithLabelValues(d.Rule.String()).Inc()
		switch d.Action {
		case chunkdedup.AnswerNow:
			c.mail[ch.Token] = chunkEvent{ledger: d.Ledger, entry: d.Entry}
		case chunkdedup.AnswerWhenPersisted:
			// A copy is in flight elsewhere: its receipt answers this one, as for any waiter.
		default: // Forward; Reject (too many waiters) goes to the broker too, untracked
			c.mail[ch.Token] = chunkEvent{promote: true}
		}
	}
	c.mu.Unlock()
	args := []any{"topic", key.topic, "producer", key.producer, "from_sequence_id", fromSeq,
		"entries_read", read, "stored_chunks_found", learned, "chunks_waiting", len(waiting),
		"took", time.Since(start).Round(time.Millisecond).String()}
	if err != nil {
		c.log.Warn("looking for chunks another proxy stored stopped early; the rest is forwarded (duplicates possible)",
			append(args, "reason", err.Error())...)
		return
	}
	c.log.Info("looked for chunks another proxy stored before forwarding a resuming producer's", args...)
}

// cancel withdraws a held chunk (waiting for a look or for its original); it reports false
// when the chunk's outcome was already decided (see rebatchPath.drop). Called on event loops.
func (c *ChunkDedup) cancel(tok chunkdedup.Token) bool {
	c.mu.Lock()
	for _, rec := range c.recovering {
		for i, ch := range rec.waiting {
			if ch.Token == tok {
				rec.waiting = append(rec.waiting[:i:i], rec.waiting[i+1:]...)
				c.mu.Unlock()
				return true
			}
		}
	}
	c.mu.Unlock()
	return c.t.Cancel(tok)
}

func newRecoveryMetrics() (*prometheus.CounterVec, prometheus.Counter) {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rebatchproxy_chunk_recoveries_total",
			Help: "Looks at a topic's newest entries before forwarding the chunks of a resuming producer this instance had no record of, by outcome (found, nothing_stored, failed)."},
			[]string{"outcome"}),
		prometheus.NewCounter(prometheus.CounterOpts{Name: "rebatchproxy_chunk_recovery_entries_read_total",
			Help: "Entries read back from brokers by those looks."})
}

// mayBeResuming reports whether a PRODUCER may resume sends made on another connection:
// the client counts reconnects in epoch (Go, Java) and this is not the first, or it names
// a producer the broker named before (a reconnect of a client that sends no epoch, or one
// that does not mark the name as its own). A first connect of a producer the application
// named, from a client that counts epochs, resumes nothing: a new process has nothing
// pending.
func mayBeResuming(c *pulsarpb.CommandProducer) bool {
	switch {
	case c.GetEpoch() > 0:
		return true
	case c.GetProducerName() == "":
		return false
	default:
		return c.Epoch == nil || !c.GetUserProvidedProducerName()
	}
}

// lookInProgress reports whether a look is running, for tests and diagnostics. Any
// goroutine may call it.
func (c *ChunkDedup) lookInProgress() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.recovering) > 0
}
