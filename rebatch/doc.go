// Package rebatch is the producer-path engine of the proxy: it takes a client producer's SEND
// frames apart and builds the entries a rewriting policy asks for, and it turns the broker's
// receipts for those entries back into exactly the receipts the client expects.
//
// It is a pure, deterministic state machine (Producer): input is parsed frames and a clock,
// output is frames for the broker and frames for the client (Output). It does no I/O, so every
// contract below is tested without sockets. One Producer serves one client producer and is
// owned by the goroutine of that client's connection.
//
// # Policies
//
//   - coalesce: consecutive messages of the producer share an entry until max messages, max
//     bytes (never above the broker's max_message_size) or max delay, and (split_keys, the
//     default) while their Key_Shared routing stays the same.
//   - properties (PIP-191): as coalesce, and a message whose restricted properties differ from
//     the open batch's flushes it first. Restricted properties are key -> allowed values (an
//     empty list admits any value); a message's group is the set of its restricted keys whose
//     value is admitted, and that set is stamped into the entry's outer properties. PIP-191's
//     worked example (msg1..msg8 -> batch1..batch5) is the golden test.
//   - buckets (PIP-486): N buckets over the 16-bit hashB ring (hashB = low 16 bits of
//     murmur3_x86_32, seed 0, of the ordering key, else the partition key). One open batch per
//     bucket, each written by its own broker producer (a lane, see lanes.go). Every entry
//     carries entry_hash_min/max (33/34) = the hashB range of its messages and an outer
//     ordering key from one of them (the sticky key the broker would hash, keyless messages
//     included, routing.go), so a Key_Shared STICKY consumer whose range is aligned to
//     bucket boundaries gets exactly the keys it owns. Per-key order holds; per-producer order
//     does not (DESIGN.md).
//   - split_keys (Policy.SplitKeys; on by default for coalesce and properties): an entry's keyed
//     messages share the sticky-key hash the broker's Key_Shared dispatch reads from the entry's
//     outer key, so each key reaches the consumer it would reach sent alone; keyless messages
//     merge only with keyless ones. Keyless messages have no owner, but on Pulsar 4 a broker
//     spreads keyless messages sent alone by "<producer>-<sequence id>", while a merged entry of
//     them goes to one consumer (routing.go).
//   - coalesce with merge_producers: every client producer of a topic on one connection writes
//     through one shared lane, a proxy-owned broker producer, so synchronous senders are merged
//     too (under split_keys, only while their keys route alike). See the sequence spaces below
//     for its price.
//
// Every entry the engine builds is in batch format (num_messages_in_batch set, even for one
// message) so stamped outer fields never become a message's own fields. A message sent without
// batching has its own fields (key, ordering key, properties, event time, sequence id, null
// flags) moved into its SingleMessageMetadata. The outer key is the first keyed message's, as
// the clients do; under buckets it is the first message's routing key in ordering_key (the
// decoded base64 key, the JDK-repaired string key, or the fallback key of a keyless message).
//
// Under coalesce, a send that would be built into an entry of its one message and sent at once
// (an unbatched, new message with nothing open or in flight on the client's producer) is
// forwarded as the client built it instead: it is that entry, and a workload that cannot merge
// pays nothing for the rebuild (Producer.alone).
//
// Never merged or split, forwarded as the original bytes after the open batch is flushed:
// chunks, markers, transactional sends (a transaction id is read by its presence: (0, 0) is
// the first of coordinator 0), encrypted payloads, delayed delivery, replicated messages, and
// any message whose metadata has a field this build does not model (a schema id, a hash range
// the client set, a newer client's field), which an entry built here would not carry. A change
// of schema version ends the open batch.
//
// # Contracts
//
// One receipt per client send, in order (DESIGN.md contract 1). Each client CommandSend is
// queued; it is answered only when every entry holding one of its messages has been
// acknowledged, and never before the sends queued ahead of it. The receipt carries the send's
// own sequence_id and highest_sequence_id verbatim. A broker error for an entry fails every
// send with a message in it, with the broker's code and message; the client's resend follows.
//
// Message ids (contract 2). The receipt's ledger:entry is that of the entry holding the send's
// first message. Clients derive per-message ids from it and their own batch index, so ids seen
// by the producing application can differ from the ids consumers see.
//
// Sequence spaces (contract 4). The broker producer is the client's own (same producer id and
// name), and the engine stays in the client's sequence space. Broker de-duplication judges an
// entry by its command ids only (its sequence_id against the highest id the producer name has
// recorded), so the ids an entry may carry are those its client sends lend it: a send's own
// command span, or its per-message ids where the client numbers every message from one counter
// (numbering.go says exactly which sends are which). Entries on one broker producer carry
// strictly increasing, disjoint ranges. The engine tracks each broker producer's mark as the
// broker will (lastPushed: moved only by entries the broker will take as new), starting from
// CommandProducerSuccess.last_sequence_id, and:
//   - merges whole sends freely, and cuts a send only into pieces it has ids for; a send
//     needing more pieces than ids (a batch of one id mixing property groups, or keys under
//     split_keys: pulsar-client-go before v0.10 mixes keys by default) is forwarded as the client
//     built it (Stats.SendsUnsplittable, logged once per
//     producer, metric rebatchproxy_rebatch_sends_as_built_total);
//   - forwards unchanged a send lying wholly at or below the mark (a resend the broker must
//     judge itself), and one numbered at or below ids the engine already sent (application ids
//     out of order, which a direct broker drops), so the broker judges it as it would directly;
//     the latter waits until the broker has stored the entries ahead of it, so it is judged
//     against a stored mark and not answered "cannot determine"; frames made for that broker
//     producer meanwhile wait behind it, and their bytes count in the producer's backlog
//     (HeldBytes), so the proxy slows the client (outoforder.go);
//   - puts the parts of a resend that lie at or below the mark in entries of their own, which
//     the broker drops as duplicates, so the new messages after them are not dropped with them.
//     Cuts depend on the send alone, so a resend is cut as its first attempt was; this is what
//     makes a send that the proxy had cut, and that was only partly stored when a connection or
//     the proxy died, end up stored exactly once.
//
// Clients that number batches rather than messages (pulsar-client-go before v0.10 leaves the
// messages' sequence ids unset: a batch of n messages is one id) are spans of one id: their
// batch may be merged whole with others, or cut across bucket producers (one piece each), and
// is forwarded as built when the policy would cut it further.
//
// Because the broker producer is the client's, no translation of last_sequence_id is needed.
//
// Buckets: one broker producer per bucket, named LaneName(client producer name, bucket), so a
// client that reconnects (to this proxy or a restarted one) finds the same producers and their
// de-duplication state. A bucket's messages are a subsequence of the client's, so their
// client sequence ids rise strictly within the lane and each lane's entries carry valid
// ranges; after any reconnect a message is a duplicate exactly when its id is at or below its
// lane's last_sequence_id (its piece's ids, for a span), and such messages go in entries of
// duplicates only. The client is
// given the highest last_sequence_id of its producers, so ids it allocates next are new in
// every lane.
//
// merge_producers: the shared lane's entries carry the proxy's own sequence ids (one per
// message), so broker de-duplication cannot relate them to a client's resend. Every send is
// answered exactly once, but after any reconnect (the client's connection or the proxy dying,
// the broker closing the producer), messages that were stored and not yet acknowledged are
// stored again when the client resends: at-least-once, the price of merging synchronous
// producers. Consumers also see the shared producer's name on those messages.
//
// Group commit: by default a lane with nothing in flight sends its open batch at once, and the
// next batch fills while that entry is in flight, so batches grow with the broker's latency
// instead of every send waiting max_delay (HoldWhenIdle keeps the old behaviour).
//
// Sends larger than an entry may be (uncompressed above max_bytes or the broker's limit) are
// forwarded as they are, compressed as the client made them.
//
// Chunks are never merged; duplicate chunks (package chunkdedup) are answered by the proxy:
// Hold, Resolve, Fail and Promote (held.go) keep such sends in the client's queue so their
// receipts still leave in order.
//
// Bounded memory (contract 7): each open batch is bounded by max bytes, and pending client sends
// by Config.MaxPendingSends; beyond that bound Send returns ErrTooManyPending and the proxy
// closes the connection with a logged reason. The proxy keeps clients below it: it stops
// reading a client's frames while one of its producers has three quarters of the bound pending,
// and reads on once receipts bring that under half (proxy.Backlogger).
package rebatch
