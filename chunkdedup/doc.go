// Package chunkdedup stops duplicate chunks from reaching a topic (the idea
// of PIP-295, done in the proxy). It is a pure state machine: no I/O, no wire
// types, an injected clock. The proxy offers every chunk a client sends and
// reports what the broker answered; the tracker says, per chunk, forward it or
// answer it.
//
// # Why
//
// When a chunking producer loses its connection it resends every chunk still
// waiting for a receipt: pulsar-client-go (producer_partition.go, grabCnx)
// writes each pending item's buffer again as it was; the Java client
// (ProducerImpl.resendMessages -> recoverProcessOpSendMsgFrom) writes each
// pending OpSendMsg's command again. So a resent chunk carries the same
// sequence id (all chunks of a message share one), chunk id,
// num_chunks_from_msg, uuid ("<producer>-<sequence id>"), publish time and
// payload: the same bytes. Producer names survive the reconnect too (the
// client re-registers under the name the broker gave it), while the
// connection does not; hence the key is (topic, producer name) and the
// tracker lives as long as the proxy process, not a connection.
//
// The broker does not help: with de-duplication on, MessageDeduplication
// (Pulsar 4.0.8, isDuplicateNormal) returns NotDup for every chunk but the
// last without looking at it, and only the last chunk is checked and
// recorded by sequence id (a duplicate last chunk gets a receipt of -1:-1);
// with de-duplication off every chunk is stored. A resent non-last chunk is
// therefore stored twice either way, and consumers before pulsar-client-go
// v0.19 / Java 3.0.2 then drop the whole message.
//
// Clients match receipts to chunks by order only (every chunk of a message has
// the same sequence id), and turn the receipt of chunk 0 into the message's
// first-chunk id: an answer must carry the stored copy's ledger:entry, and the
// caller must release answers in the client's send order (the tracker decides,
// it does not order).
//
// # Rules
//
// Per (topic, producer name) the tracker remembers the last
// MaxMessagesPerProducer chunked messages by sequence id; for each chunk, its
// fingerprint and whether it is unseen, in flight (forwarded, fate unknown) or
// persisted (with its ledger:entry). A chunk offered is:
//
//  1. Persisted copy known: answered now with the stored ledger:entry
//     (AnswerNow, RulePersisted). Never -1:-1.
//  2. Copy in flight: held until the original's receipt, then answered with
//     its ledger:entry (AnswerWhenPersisted, RuleInFlight). If the original
//     fails instead, the first held copy is forwarded in its place (Failed
//     returns it) and the others wait for that one. At most MaxWaiters are
//     held; beyond that the copy is rejected (Reject, RuleWaitersFull) so the
//     client resends later.
//  3. Same sequence id, but a different chunk count or different bytes than
//     the copy seen: the producer restarted and reused the sequence id (a new
//     process after CommandProducerSuccess.last_sequence_id, or an application
//     supplying ids). The old record is dropped and the chunk forwarded
//     (RuleRestarted). A lower sequence id than before is not a restart sign
//     by itself: after a reconnect a client resends older pending messages
//     first. So CommandProducerSuccess is not an input; the bytes decide.
//  4. Otherwise it is forwarded (RuleFirstCopy, or RuleForgotten when it lies
//     at or below the producer's persisted mark but its position is not
//     remembered: answering would have to invent an id, so the broker gets
//     it). A message with a new sequence id starts a new record; the newest
//     record is the message in progress, older ones stay for late resends.
//
// A forwarded chunk's fate must be reported: Persisted with the receipt's
// ledger:entry, or Failed on a SendError or when the broker connection closes
// before the receipt. A failed chunk is not recorded as persisted; its next
// copy is forwarded. A receipt of -1:-1 (the broker's own duplicate answer,
// for a last chunk when the tracker had forgotten it) is relayed to waiters but
// not remembered. A chunk whose fate is unknown because the broker connection
// died after persisting it cannot be told apart from a lost one; its resend is
// forwarded and may be stored twice (a last chunk is still caught by broker
// de-duplication when that is on).
//
// # Recovery: what another instance stored
//
// The record lives in one proxy process. When that process dies (kill -9, a
// crash, a node lost), or the client's reconnect lands on another instance
// behind the same address, the client resends every chunk still waiting for
// a receipt to an instance that knows nothing of them, and some of them are
// stored already. So when a producer that may be resuming (it reconnected)
// sends its first chunk on a connection, the caller looks at what the topic
// stores before it forwards anything more of that producer: it reads the
// topic's newest entries back through the broker, newest first, down to the
// producer's first entry with a sequence id below the resent chunk's (what
// the producer sent before the resumed message), and gives the chunks of that
// producer it found to Learn. They are recorded as persisted, with their
// positions and fingerprints, and the resent copies are then offered as
// usual: rule 1 answers the copies of stored chunks, rule 3 forwards a chunk
// whose stored namesake has other bytes. Known reports whether a record
// exists.
//
// Cost: one look per reconnect of a chunking producer (not per chunk, not for
// producers that never chunk); the look reads the resumed messages' stored
// chunks plus whatever other producers interleaved, bounded by the caller
// (entries and time). Meanwhile the producer's sends wait. The fingerprint
// must be computable from what a stored entry still carries when read back
// (the proxy uses the payload, publish time and uuid). A look that fails or
// hits its bound learns less, so more is forwarded: duplicates at worst, as
// without the proxy; a chunk is never answered without a stored copy.
//
// # Bounds
//
// Keys are evicted least recently used first beyond MaxProducers, and after
// TTL idle; chunk slots are capped by MaxTrackedChunks, evicting other keys
// and then a key's oldest messages. Keys and messages with a chunk in flight
// or a waiter are pinned (never evicted) because a client is waiting on them;
// when only pinned state is left, new chunks are forwarded untracked
// (RuleUntracked), which is the broker's behaviour without the proxy. Config
// documents the memory bound.
//
// # Invariants (checked by FuzzTracker)
//
//   - A duplicate is answered only with a position a receipt reported, or
//     Learn was told of, for an identical copy (same key, sequence id, chunk
//     id and bytes).
//   - While a chunk is remembered, an identical copy is not forwarded again.
//   - Every held duplicate gets exactly one outcome: an answer, a promotion,
//     or a Cancel.
//   - Sizes stay within Config.
package chunkdedup
