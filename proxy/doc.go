// Package proxy is the transparent Pulsar-protocol proxy: the connection
// core (the per-connection state machine, discovery rewriting, forwarding,
// backpressure), which sees its connections only as sides (side.go), and
// its gnet transport (server.go, sock.go). The re-batching engine plugs in
// through ProducerPath. The core's specs (core_test.go) drive it on byte
// slices, one per contract below.
//
// # Design
//
// Every client connection gets its own broker connection, enrolled on the
// client's gnet event loop (EventLoop.Enroll with a net.Conn dialled, with
// the connect timeout, on a short-lived goroutine; gnet's Register would
// dial without a timeout). Both conns of a pair are therefore served by the
// same goroutine and forwarding is a plain Write, lock-free.
//
// The proxy forwards the client's own CONNECT (with proxy_to_broker_url
// removed) to the broker, so the broker authenticates the client itself:
// auth method and data, AUTH_CHALLENGE and AUTH_RESPONSE, errors and the
// broker's CONNECTED (max_message_size, feature flags, protocol version)
// pass through untouched. The broker sees an ordinary client; no proxy
// role, original_principal or proxy credentials are involved. Apache
// Pulsar's proxy instead authenticates clients itself and connects as a
// proxy role; that needs broker configuration this design does not.
//
// # Contracts
//
//  1. Discovery. A CONNECT without proxy_to_broker_url is a lookup
//     connection and goes to a configured service broker (round robin,
//     next one on a dial error). The only frame the proxy rewrites is
//     LOOKUP_RESPONSE: an answer of type Connect gets
//     proxy_through_service_url=true, so clients come back to the proxy
//     and name the broker in proxy_to_broker_url, and the broker address
//     is learned as allowed. A Redirect answer is followed by the proxy
//     itself (lookup.go), as Pulsar's proxy does: it asks the named broker,
//     on a connection of its own opened with the client's CONNECT (so that
//     broker authenticates the client), with the redirect's authoritative
//     flag and the client's topic, listener name and properties, and
//     repeats on further Redirects, at most Config.MaxLookupRedirects hops
//     within Config.LookupTimeout. The client gets only the final answer,
//     under its own request id: Connect rewritten as above (the broker
//     learned), a broker's Failed as is, or Failed(ServiceNotReady) naming
//     the topic and the reason when the proxy gives up (target unreachable,
//     timeout, CONNECT refused, too many redirects). Every redirect target
//     is learned too. A target answering the CONNECT with AUTH_CHALLENGE,
//     and MaxLookupRedirects 0, make the proxy relay the Redirect with
//     proxy_through_service_url=true instead; the client then follows it
//     through the proxy (naming the target in proxy_to_broker_url). The
//     request's concurrent-lookup slot is held until the final answer is
//     written or the session closes; LOOKUP requests are decoded to be
//     remembered meanwhile (rare frames).
//     PARTITIONED_METADATA, GET_TOPICS_OF_NAMESPACE, GET_SCHEMA and
//     GET_OR_CREATE_SCHEMA are forwarded unchanged, and so are their
//     answers.
//  2. No open relay (DESIGN contract 6). A proxy_to_broker_url that is not
//     a configured service broker, an allowed broker, or a broker learned
//     from a broker's own frames (a lookup answer or redirect, or the
//     assigned_broker_service_url of a CLOSE_PRODUCER / CLOSE_CONSUMER that
//     moves a topic under the extensible load manager) is answered with
//     ERROR(ServiceNotReady, "Target broker cannot be validated.") and the
//     connection is closed, as Pulsar's proxy does. Learned addresses are
//     bounded (oldest forgotten first).
//  3. Transparency. Every frame but LOOKUP_RESPONSE is forwarded as its
//     original bytes, in order, both ways; the frames one read delivers go
//     out in one write, the frames the proxy makes towards the same side in
//     their place included (gather.go). Exceptions are the producer path's (rebatch) and managed
//     Key_Shared subscriptions' (keyshared.go: a held and rewritten SUBSCRIBE,
//     withheld FLOW, MESSAGE dropped for a consumer being closed, the proxy's
//     CLOSE_CONSUMER to broker and client). The proxy never sends a client a
//     command type the client did not ask for, but for that CLOSE_CONSUMER,
//     which brokers send too: its own frames are ERROR answering CONNECT,
//     LOOKUP_RESPONSE / PARTITIONED_METADATA_RESPONSE answering a request
//     refused by the concurrency bound (TooManyRequests), and the
//     LOOKUP_RESPONSE ending a followed redirect chain (contract 1).
//  4. Protocol checks. The first frame must be CONNECT; until CONNECTED
//     only AUTH_RESPONSE may follow from the client, and only CONNECTED,
//     AUTH_CHALLENGE or ERROR may come from the broker; a second CONNECT,
//     or a command only brokers send arriving from the client, is out of
//     order. Frames over max_message_size+10 KiB (the configured size until
//     the broker's CONNECTED gives its own), corrupt frames and a peer
//     closing mid-frame end the pair with a logged reason (errors.go). One
//     bad connection never affects another.
//  5. Bounded memory and backpressure (DESIGN contract 7). A direction
//     whose receiver is slow slows its sender, as a direct connection
//     would, whatever the sender's own window: when more than
//     SoftBufferLimit bytes are queued towards one side, the proxy stops
//     taking frames from the other side and parks that side's socket
//     (sock.go). gnet reads every socket on its loop and cannot pause one,
//     so parking takes the socket off the loop: the session keeps a
//     duplicate of its descriptor and closes the gnet conn (gnet closes
//     only its own descriptor; the socket lives on). Nobody reads a parked
//     socket, its receive buffer fills and TCP closes the sender's window:
//     a producer's writes block as on a slow broker, a broker stops writing
//     to a consumer that does not read. Frames the proxy writes towards a
//     parked socket go straight to its descriptor (what it does not take
//     waits, bounded by the limits below, and is retried on the resume
//     checks). Once the queue is under half the limit the socket is
//     enrolled on the same loop again (EventLoop.Enroll) and the bytes gnet
//     had read but the session had not consumed are taken first. A paused
//     or parked session checks for that on a timer of its own, not on the
//     ticker's 100 ms pace: first after pausedTick (2 ms), then after a
//     quarter of the time since its last pause, park or output left
//     waiting for a full parked socket, up to the tick interval
//     (backpressure.go), so a receiver draining at any steady rate is not
//     left idle with its queue empty, and a side slow for long costs ten
//     checks a second. A producer path reporting a backlog (Backlogger:
//     receipts outstanding) parks the client the same way until receipts
//     bring it down. A pair paused or parked is
//     not idle (contract 6).
//     Limits of the mechanism: a socket with bytes queued for it in gnet
//     cannot be parked (gnet's close writes them once and drops the rest),
//     so a side that neither reads nor stops sending cannot be slowed; its
//     frames then wait in gnet's inbound buffer, and when a direction holds
//     more than HardBufferLimit the pair is closed with ErrBufferLimit, the
//     log line saying it is the last resort. Each park and return costs a
//     few system calls (dup, close, enroll); the pause thresholds are half
//     a limit apart, so a steadily slow side parks about once per half
//     limit drained. Peer closes are seen only once a parked socket is read
//     again.
//     Memory budget: the bytes all sessions hold (unread input, queued
//     output, frames held behind a cut-through frame) are summed
//     (publishHeld, one atomic add per OnTraffic that changed them); while
//     the sum is above half of MemoryBudget, every direction's soft limit
//     drops to 256 KiB, so slow sides are slowed harder and fast ones,
//     whose queues are empty, are unaffected. Connections then hold at most
//     half the budget plus 256 KiB, a read and a frame per direction; the
//     other half is headroom for garbage not yet collected (cmd/proxy sets
//     Go's memory limit to the budget). Held frames (contract 8)
//     add at most HardBufferLimit per direction. What the sum does not
//     count is kept small per connection instead: a side waiting for input
//     holds no read buffer (gnet's loop reads into its own; a connSide's
//     reader borrows an array once its socket is readable: 64 KiB, or
//     256 KiB for a stream while the soft limit is 1 MiB or more, never
//     while the budget has lowered it, and at most an eighth of the budget
//     in such arrays at once; a remainder a small array holds is moved to
//     one; connside_chunks.go), so idle connections cost their state, not
//     64 KiB each.
//     Lookups: at most MaxConnectionLookups in flight from one connection
//     and MaxConcurrentLookups in all; the excess is answered
//     TooManyRequests, the connection's own bound first, so a client
//     flooding lookups is refused its own excess and nobody else's. A
//     repeated log event of a connection (a refused lookup) takes at most
//     one line per 10 s, carrying the count suppressed since (lograte.go).
//  6. Timeouts. Broker dial: ConnectTimeout. Accept to CONNECTED relayed:
//     HandshakeTimeout. No traffic either way (and no direction held by
//     backpressure): IdleTimeout. gnet has no
//     deadlines; OnTick checks a coarse clock and asks the loop to close.
//     Closing either side closes the other after flushing what was queued.
//  7. Hot path. Per forwarded frame: the wire.ReadFrame header walk (or
//     wire.ReadHead for a frame cut through, contract 8), a type switch and
//     two atomic counter adds; no allocation, no decode. Decoded are only
//     rare frames, for routing, credentials and logs: CONNECT, CONNECTED,
//     LOOKUP and PARTITIONED_METADATA (when redirects are followed),
//     LOOKUP_RESPONSE, PRODUCER, SUBSCRIBE, SEND_ERROR, AUTH_RESPONSE,
//     AUTH_CHALLENGE (on a proxy-role connection), CLOSE_PRODUCER and
//     CLOSE_CONSUMER; and, by the producer path, what its policy needs of a
//     producer's frames (rebatch: SEND and its receipts). On a session with
//     a managed Key_Shared consumer (keyshared.go), MESSAGE, FLOW, ACK and
//     REDELIVER_UNACKNOWLEDGED_MESSAGES are read for their consumer and
//     entry ids (no decode, no allocation; a map insert or delete per
//     entry), and SUCCESS and ERROR decoded while the proxy awaits an answer.
//  8. Cut-through. A frame is normally forwarded once all of it has been
//     read. A MESSAGE of at least 16 KiB, and a SEND of that size that the
//     ProducerPath lets go on from its command alone (HeadForwarder: a
//     passthrough producer's send that is not a chunk), is forwarded as its
//     bytes arrive instead (smaller frames are cheaper to gather): once the
//     frame's command is buffered, what has arrived is written and the
//     rest is passed straight from gnet's read buffer to the peer as it
//     comes, without being gathered first. That saves the copies of
//     gathering a large frame across reads and the wait for its last byte.
//     While such a frame is in transit towards a side, frames the proxy
//     writes itself towards that side (a re-batched entry, an answer) are
//     held, bounded by HardBufferLimit, and written right after its last
//     byte, so no frame is ever cut by another. The CRC is the receiver's
//     to check, as for every forwarded frame. If the source closes in the
//     middle, the peer has received part of a frame and is closed too
//     (ErrTruncated is logged); duplicate-chunk draining is skipped then,
//     since the broker side cannot carry another frame.
//
// # Transports
//
// The core (session.go, backpressure.go, lookup.go) sees its connections as
// sides (side.go). The gnet transport (server.go, sock.go) serves the
// plaintext listener and dials brokers onto the client's loop. The net.Conn
// transport (connside.go) serves the TLS listener (server_tls.go): each
// session runs on an executor of its own (connLoop), with a reader goroutine
// per connection that blocks in reads and runs the session on what it read
// when the executor is free; the session's writes go to the socket at once
// without blocking, and a writer goroutine per connection writes, blocking,
// only what a slow receiver did not take (connside_raw.go). Parking a side
// stops its reader after the read it is in, so backpressure reaches the
// sender as on the gnet transport. A TLS client's lookup answers carry brokerServiceUrlTls
// = pulsar+ssl://<the broker's plaintext address> (setTLSURL): TLS clients
// name that URL in proxy_to_broker_url, and the proxy dials the plaintext
// address (BrokerAddress), so the allow-list treats both spellings alike.
// Handshakes are bounded by HandshakeTimeout; a failed one closes the
// connection with a rate-limited log line naming the reason.
// With TLS to brokers (Config.BrokerTLS, broker_tls.go), every session's
// broker side is a connSide on the session's own executor (a gnet loop or
// a connLoop), since gnet cannot carry TLS: a plaintext client's loop then
// seals the records towards the broker itself (AES-GCM costs less than the
// write(2) it precedes, and there is no hand-off to a writer goroutine); lookup answers are rewritten to
// name the broker's TLS address in both URL fields, so the proxy dials TLS
// addresses only.
//
// # Goroutines
//
// Server methods say which goroutine may call them. A session is owned by
// its client's event loop (both of its sockets, parked or not, are served
// there; a parked socket returns to that loop); the ticker goroutine reads only its atomic
// fields and hands work to the loop with EventLoop.Execute. The dial
// goroutine writes brokerAddr before Enroll, which publishes it to the
// loop. ProducerPath methods run on the loop. A followed lookup redirect
// runs on its own goroutine with copies of what it needs and hands its
// outcome to the loop with EventLoop.Execute.
package proxy
