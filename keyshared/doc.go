// Package keyshared manages the Key_Shared subscriptions of topics under the buckets policy
// for consumers that did not align themselves to the buckets: a client's Key_Shared SUBSCRIBE
// in AUTO_SPLIT mode, or STICKY without hash ranges, goes to the broker as STICKY with hash
// ranges made of whole buckets, which this package assigns across the subscription's
// consumers. An entry of the buckets policy holds the keys of one bucket, so with whole-bucket
// ranges every message of an entry belongs to the consumer the broker sends the entry to.
//
// # Contract
//
//  1. Ownership. The manager grants a bucket to at most one consumer at a time, and once the
//     group is settled every bucket is held by one. A consumer only ever holds the ranges this
//     package granted it. At the broker a grant can race the previous holder's close when that
//     close travels on another connection (a client's connection dropping): the broker refuses
//     the overlapping subscribe (ConsumerAssignError), and the proxy re-sends it every 250 ms
//     for 5 s before passing the refusal on.
//  2. Balance. With n consumers and N buckets, the first min(n, N) consumers in order of
//     arrival each get a contiguous block of N/n buckets (floor or ceiling, in arrival order).
//     Consumers beyond N are refused (the client's subscribe fails with a message saying so);
//     there is no standby.
//  3. Handoff. When the set of consumers changes (one joins, one leaves), every consumer whose
//     block changes is released: the proxy stops passing its FLOW permits to the broker, waits
//     until it has acknowledged every entry it was sent and stays so for a short settle (the
//     broker applies acknowledgments asynchronously), or HandoffTimeout passes, closes it
//     at the broker, drops what the broker still sends it, and sends the client CLOSE_CONSUMER,
//     the broker's own "resubscribe" signal. The client's resubscribe gets its new block once no
//     other consumer still holds any of it at the broker. A bucket therefore moves only after
//     its previous owner has acknowledged everything it was sent in it: no key is processed by
//     two consumers at once, per-key order is kept, and acknowledged messages are not delivered
//     again. The acknowledgments are the client's fire-and-forget ACK frames; the settle (200
//     ms) is what lets the broker apply them before the close, measured rather than confirmed
//     (without it the broker redelivered thousands of just-acknowledged messages in the e2e
//     spec; with it, none), so a broker slower than that can redeliver some. A drain cut short by
//     HandoffTimeout closes the consumer with messages unacknowledged, possibly in the
//     application's hands: the broker redelivers those to the bucket's next owner
//     (at-least-once, as when any Pulsar consumer closes, and for those messages two consumers
//     may overlap), and the proxy counts it (drain_timeout).
//  4. Reservation. A released consumer keeps its place in the order (and its block, unowned
//     meanwhile, and its count against the bucket limit of contract 2) for AwayTimeout, even
//     when its connection closes (clients often resubscribe on a new connection); if it has not
//     resubscribed by then, it is removed and the group rebalanced without it. The client's own
//     close of a consumer within 2 s of being told to resubscribe keeps its place too: some
//     clients (pulsar-rs) close the consumer id before they subscribe it again, and leaving
//     there would rebalance at once and release the others, for ever with two such clients.
//     The cost, when it was the application closing it: its block stays unowned, and counts
//     against the bucket limit, for AwayTimeout. A consumer that is not released, or closed
//     later, leaves when its client closes it or its connection closes.
//  5. Scope. The manager sees the consumers of one proxy process. Consumers of the same
//     subscription reaching the broker another way (directly, or through a second proxy)
//     hold ranges this manager does not know: the broker refuses whichever subscribe overlaps
//     (ConsumerAssignError), and the proxy passes that refusal to the client after a few
//     retries. A managed subscription must therefore be reached through one proxy instance.
//
// # Goroutines
//
// A Manager's methods and a Ticket's methods may be called from any goroutine; they take the
// manager's lock. Member callbacks are made after the lock is released, on the goroutine of
// the call that changed the group (or a timer's); implementations hand the work to their own
// loop and must not call back into the manager synchronously from the callback.
package keyshared
