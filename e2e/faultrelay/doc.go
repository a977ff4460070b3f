// Package faultrelay is a fault-injecting TCP relay for end-to-end tests. It sits between Pulsar
// clients and one server (a broker or the proxy), forwards frames both ways, and cuts a
// connection when a Rule says so. It runs in-process: Start it, point a client at URL(), read
// Cuts() afterwards.
//
// # What it does to traffic
//
// Every frame is read whole with wire.ReadFrame in both directions and forwarded as its original
// bytes, with two exceptions:
//
//   - LOOKUP_RESPONSE (server to client) is rewritten when Config.RewriteLookups is set; see
//     "Lookups" below.
//   - While a Rule is active on a connection, frames are withheld or dropped as the Rule says.
//
// # The cut rule
//
// A Rule counts the client-to-server frames its Matcher selects (ChunkSends: SEND frames whose
// MessageMetadata has chunk_id). On the first connection where a matching frame appears (up to
// Rule.Connections connections; later ones are relayed untouched):
//
//  1. From the HoldFrom-th matching frame on (default: the first), SEND_RECEIPT and SEND_ERROR
//     frames from the server are withheld from the client (dropped and counted). Other
//     server-to-client frames still flow.
//  2. Right after the After-th matching frame is forwarded, nothing more is forwarded in either
//     direction: further client frames are dropped, and the relay waits (at most Rule.Drain)
//     until the server has answered every SEND forwarded on the connection, so that the server
//     has persisted the forwarded chunks before the cut.
//  3. Then Rule.BeforeClose runs, if set (a test may kill the server there), and both sides are
//     closed. The client sees a dropped connection with the forwarded sends still pending,
//     reconnects and resends them: the server stores those sends twice.
//
// Each firing is recorded as a Cut (what was forwarded, withheld and dropped, and whether the
// server answered every forwarded send in time). Fired() is closed after the last allowed firing.
//
// # Lookups: why the relay rewrites LOOKUP_RESPONSE
//
// A Pulsar client sends its topic lookup to the service URL and then opens its data connection
// to the broker URL the lookup answer names. If the client's service URL is the relay and the
// answer named the broker, the producer would bypass the relay. Two ways keep it on the relay:
//
//   - (chosen) the relay rewrites broker_service_url in LOOKUP_RESPONSE answers of type Connect
//     to its own URL, so the client opens its data connection to the relay, which forwards it to
//     its one upstream. This works for any client and for a broker directly, without any proxy
//     behaviour in the broker, and leaves CONNECT untouched.
//   - setting proxy_through_service_url=true instead would make clients send CONNECT with
//     proxy_to_broker_url to the relay, which would then have to act as a Pulsar proxy (strip
//     the field, pick the broker); the broker itself would not understand it. Only the real
//     proxy needs that flow.
//
// Guard rails of the rewrite: only a broker_service_url whose host:port equals Config.Upstream
// (or one of Config.UpstreamAliases) is rewritten, since the relay has a single upstream; any other
// answer, Redirect answers, and answers that already say proxy_through_service_url=true are
// forwarded unchanged and counted in Stats. The last case is what keeps the relay transparent in
// front of the proxy: the proxy's answers carry proxy_through_service_url=true, so clients come
// back to their service URL (the relay) and name the broker in proxy_to_broker_url, which the
// relay forwards unchanged to the proxy.
//
// # Slow links
//
// Config.ToServerRate paces each connection's client-to-server bytes (a slow or congested link
// towards the server); HoldToClient stops the relay reading from the server on every connection
// until ReleaseToClient (clients that stop reading their sockets). Both push back through TCP
// only: nothing is dropped.
//
// # Limits
//
// One upstream per relay (enough for a standalone broker or one proxy). Plaintext only. Frames
// larger than Config.MaxFrameSize end the connection. Receipts are withheld by position, not by
// sequence id (all chunks of a message share one sequence id): a receipt the server sends for an
// earlier, non-matching send after holding began is withheld too.
package faultrelay
