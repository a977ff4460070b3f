package proxy

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/keyshared"
	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// Proxy-managed Key_Shared subscriptions (Config.ManagedKeyShared; package keyshared holds
// the assignment and its contract). This file is the session's half: it holds a client's
// managed SUBSCRIBE until the manager grants it a block of buckets, sends it on as STICKY with
// that block's hash range, and carries out a release:
//
//  1. drain: the client's FLOW permits for the consumer are no longer passed on, so the broker
//     stops dispatching to it once the permits it has run out; the session tracks the entries
//     sent to the consumer and not yet acknowledged (MESSAGE adds, ACK and
//     REDELIVER_UNACKNOWLEDGED_MESSAGES remove);
//  2. once none is left (and stays so for ackSettle), or HandoffTimeout passes, the proxy closes the consumer at the broker
//     (its own CLOSE_CONSUMER, an id from the session's allocator) and drops what the broker
//     still sends it (the broker redelivers that to the bucket's next owner);
//  3. on the broker's answer, the client gets CLOSE_CONSUMER (what a broker sends when a topic
//     moves), the manager learns the consumer is away, and the client's own resubscribe comes
//     back through step 0 with its new block.
//
// A client's own CLOSE_CONSUMER of a managed consumer that comes within ackSettle of its last
// ACK is held until the settle has passed, for the same reason as step 2's settle. One of a
// consumer already away (step 3) is answered by the proxy and keeps the consumer's place
// (keyshared contract 4).
//
// Cost: sessions without a managed consumer pay one nil-map check per consumer frame. A session
// with one reads consumer_id of each MESSAGE, FLOW, ACK and REDELIVER (no decode, no
// allocation) and keeps a set of unacknowledged entries per managed consumer, bounded by
// maxTrackedEntries (past it the drain waits for HandoffTimeout).

// maxTrackedEntries bounds the unacknowledged entries tracked per managed consumer; a client
// granting more permits than that makes its drains end by timeout.
const maxTrackedEntries = 1 << 17

// subscribeRetries bounds the re-sends of a granted SUBSCRIBE the broker refused for
// overlapping ranges (the previous owner's close racing on another connection).
const (
	subscribeRetries    = 20
	subscribeRetryDelay = 250 * time.Millisecond
)

// ackSettle is how long a drained consumer must stay without unacknowledged entries before
// the proxy closes it: the broker applies acknowledgments asynchronously, and a close right
// after the last ACK frame made it redeliver messages just acknowledged (measured: thousands
// of duplicates in e2e/rebatch's managed spec; none with the pause).
const ackSettle = 200 * time.Millisecond

// resubscribeCloseGrace is how soon after being told to resubscribe a client's own close of
// the consumer counts as the first step of its resubscribe (pulsar-rs closes the id at once,
// before its lookup) and keeps the consumer's place; a later close is the application's, and
// the consumer leaves, as any closed consumer does.
const resubscribeCloseGrace = 2 * time.Second

type mcState uint8

const (
	mcHeld        mcState = iota // the client's SUBSCRIBE waits for a grant
	mcSubscribing                // the rewritten SUBSCRIBE is at the broker
	mcActive                     // subscribed
	mcDraining                   // released: FLOW withheld until nothing is unacknowledged
	mcClosing                    // the proxy's CLOSE_CONSUMER is at the broker
	mcAway                       // closed at the broker; the client was told to resubscribe
	mcLeaving                    // the client's CLOSE_CONSUMER is at the broker
)

// managedConsumer is one client consumer of a managed subscription on this session.
// Loop-owned.
type managedConsumer struct {
	s          *session
	id         uint64 // the client's consumer id
	topic, sub string
	name       string
	ticket     *keyshared.Ticket
	subscribe  *pulsarpb.CommandSubscribe // the client's, rewritten on each grant
	ranges     []keyshared.Range
	state      mcState
	release    bool // a release came while subscribing
	// clientClose is the request id of the client's CLOSE_CONSUMER that came while the
	// proxy's own close was at the broker (answered by the proxy); 0 none.
	clientClose uint64
	pending     map[wire.EntryID]struct{}
	overflow    bool // pending is incomplete
	// Deadlines (unix ns, 0 none), run by ksTick from the server's ticker: the end of the ack
	// settle, of the drain, and a subscribe retry.
	settleAt, drainAt, retryAt int64
	// lastAck is when the client last acknowledged something for it (unix ns); heldClose, the
	// client's CLOSE_CONSUMER held until closeAt, ackSettle after that acknowledgment.
	lastAck   int64
	awayAt    int64 // when the client was told to resubscribe (unix ns)
	heldClose []byte
	closeAt   int64
	reqID     uint64 // the request id of what is at the broker for it (subscribe, close)
	retries   int
}

// ksMember adapts a managedConsumer to keyshared.Member: callbacks come from any goroutine and
// are handed to the session's loop.
type ksMember struct{ mc *managedConsumer }

func (m ksMember) Grant(r []keyshared.Range) { m.mc.s.onLoop(func() { m.mc.grant(r) }) }
func (m ksMember) Release()                  { m.mc.s.onLoop(m.mc.startRelease) }
func (m ksMember) Refuse(reason string)      { m.mc.s.onLoop(func() { m.mc.refuse(reason) }) }

// onLoop runs f on the session's loop unless the session is closed by then.
func (s *session) onLoop(f func()) {
	if err := s.exec.run(func() {
		if s.state != stClosed {
			f()
		}
	}); err != nil {
		s.srv.log.Debug("managed Key_Shared callback dropped: loop stopping", "conn", s.id, "err", err)
	}
}

// managedSubscribe takes a client SUBSCRIBE (decoded in s.cmd) that Config.ManagedKeyShared
// claims; it reports false for one left alone. Runs on the loop.
func (s *session) managedSubscribe(c *pulsarpb.CommandSubscribe) bool {
	if s.srv.ks == nil || c.GetSubType() != pulsarpb.CommandSubscribe_Key_Shared {
		return false
	}
	if ks := c.GetKeySharedMeta(); ks != nil && ks.GetKeySharedMode() == pulsarpb.KeySharedMode_STICKY {
		// Aligned by the application: its ranges are its own. Without ranges, the broker
		// refuses it ("Ranges for KeyShared policy must not be empty"), as directly.
		return false
	}
	ring := s.srv.cfg.ManagedKeyShared(c.GetTopic())
	if ring == nil {
		return false
	}
	if old := s.ks[c.GetConsumerId()]; old != nil {
		if old.state == mcHeld { // the client sent its subscribe again while it waits
			old.subscribe = proto.Clone(c).(*pulsarpb.CommandSubscribe)
			return true
		}
		if old.state != mcAway {
			// The consumer exists at the broker (or is being closed there): its SUBSCRIBE again
			// goes on unchanged, for the broker to answer as for any known consumer id.
			old.log("client subscribed again under a consumer id it holds; forwarded unchanged", "state", old.state)
			return false
		}
		delete(s.ks, old.id) // its resubscribe: Join gives the place back to the new ticket
	}
	mc := &managedConsumer{s: s, id: c.GetConsumerId(), topic: c.GetTopic(), sub: c.GetSubscription(), name: c.GetConsumerName(),
		subscribe: proto.Clone(c).(*pulsarpb.CommandSubscribe), pending: map[wire.EntryID]struct{}{}}
	if s.ks == nil {
		s.ks = map[uint64]*managedConsumer{}
	}
	s.ks[mc.id] = mc
	s.logger().Debug("managed Key_Shared SUBSCRIBE held for its buckets", "topic", mc.topic, "subscription", mc.sub,
		"consumer_id", mc.id, "consumer_name", mc.name)
	mc.ticket = s.srv.ks.Join(mc.topic, mc.sub, ring, keyshared.Identity{ConsumerID: mc.id, Name: mc.name}, ksMember{mc})
	return true
}

func (mc *managedConsumer) log(msg string, args ...any) {
	mc.s.logger().Info(msg, append([]any{"topic", mc.topic, "subscription", mc.sub, "consumer_id", mc.id, "consumer_name", mc.name}, args...)...)
}

// current reports whether mc is still the session's consumer of its id.
func (mc *managedConsumer) current() bool { return mc.s.ks[mc.id] == mc }

// grant sends the held SUBSCRIBE on with the granted ranges. Runs on the loop.
func (mc *managedConsumer) grant(r []keyshared.Range) {
	if !mc.current() || mc.state != mcHeld {
		mc.log("managed Key_Shared grant not taken", "current", mc.current(), "state", mc.state)
		mc.ticket.Leave()
		return
	}
	mc.s.srv.m.keyShared[ksGrant].Add(1)
	mc.ranges = r
	mc.sendSubscribe()
}

func (mc *managedConsumer) sendSubscribe() {
	c := proto.Clone(mc.subscribe).(*pulsarpb.CommandSubscribe)
	// The client's own key-shared options (out-of-order delivery, entry bucket dispatch, any
	// a newer client sends) stay; only the mode and the ranges are the proxy's.
	meta := c.GetKeySharedMeta()
	if meta == nil {
		meta = &pulsarpb.KeySharedMeta{}
	}
	meta.KeySharedMode, meta.HashRanges = pulsarpb.KeySharedMode_STICKY.Enum(), nil
	for _, x := range mc.ranges {
		meta.HashRanges = append(meta.HashRanges, &pulsarpb.IntRange{Start: proto.Int32(x.Start), End: proto.Int32(x.End)})
	}
	c.KeySharedMeta = meta
	mc.state, mc.reqID = mcSubscribing, c.GetRequestId()
	mc.s.ksRequest(mc, mc.reqID)
	mc.log("managed Key_Shared consumer subscribing with its buckets", "hash_ranges", fmt.Sprint(mc.ranges))
	mc.s.writeOwn(toBroker, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_SUBSCRIBE.Enum(), Subscribe: c})
}

// refuse answers the held SUBSCRIBE with an error. Runs on the loop.
func (mc *managedConsumer) refuse(reason string) {
	if !mc.current() {
		return
	}
	mc.s.srv.m.keyShared[ksRefused].Add(1)
	mc.s.ksRemove(mc)
	mc.log("managed Key_Shared consumer refused", "reason", reason)
	mc.s.writeOwn(toClient, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_ERROR.Enum(), Error: &pulsarpb.CommandError{
		RequestId: proto.Uint64(mc.subscribe.GetRequestId()), Error: pulsarpb.ServerError_ConsumerBusy.Enum(), Message: proto.String(reason)}})
}

// startRelease begins a release (step 1). Runs on the loop.
func (mc *managedConsumer) startRelease() {
	if !mc.current() {
		return
	}
	switch mc.state {
	case mcSubscribing, mcHeld:
		// Drained once the broker has accepted it. The manager releases only members it granted,
		// so a Release seen while held means the Grant is still on its way (callbacks made on
		// different goroutines may arrive out of order) or a retry is pending.
		mc.release = true
		return
	case mcActive:
	default:
		return
	}
	mc.s.srv.m.keyShared[ksRelease].Add(1)
	mc.state = mcDraining
	mc.log("releasing managed Key_Shared consumer for a rebalance: waiting for it to acknowledge what it was sent",
		"unacknowledged_entries", len(mc.pending), "limit", mc.s.srv.cfg.HandoffTimeout)
	mc.drainAt = mc.s.nowNS() + int64(mc.s.srv.cfg.HandoffTimeout)
	mc.checkDrained()
	mc.s.ksArm()
}

// checkDrained starts the ack settle once nothing is unacknowledged, and cancels it when
// something is again (the broker may still use permits it had).
func (mc *managedConsumer) checkDrained() {
	if mc.state != mcDraining {
		return
	}
	if len(mc.pending) > 0 || mc.overflow {
		mc.settleAt = 0
		return
	}
	if mc.settleAt == 0 {
		mc.settleAt = mc.s.nowNS() + int64(ackSettle)
		mc.s.ksArm()
	}
}

func (mc *managedConsumer) drainExpired() {
	mc.s.srv.m.keyShared[ksDrainTimeout].Add(1)
	mc.s.logger().Warn("managed Key_Shared consumer did not acknowledge what it was sent within the handoff timeout; closing it anyway, the broker redelivers the rest to the buckets' next owner",
		"topic", mc.topic, "subscription", mc.sub, "consumer_id", mc.id, "consumer_name", mc.name,
		"unacknowledged_entries", len(mc.pending), "tracking_complete", !mc.overflow, "timeout", mc.s.srv.cfg.HandoffTimeout)
	mc.closeAtBroker()
}

// closeAtBroker is step 2.
func (mc *managedConsumer) closeAtBroker() {
	mc.settleAt, mc.drainAt = 0, 0
	mc.state, mc.reqID = mcClosing, mc.s.ids.next()
	mc.s.ksRequest(mc, mc.reqID)
	mc.s.writeOwn(toBroker, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_CLOSE_CONSUMER.Enum(),
		CloseConsumer: &pulsarpb.CommandCloseConsumer{ConsumerId: proto.Uint64(mc.id), RequestId: proto.Uint64(mc.reqID)}})
}

// answerClientClose answers the client's own CLOSE_CONSUMER, which came while the proxy's
// close was at the broker, and removes the consumer.
func (mc *managedConsumer) answerClientClose() {
	req := mc.clientClose
	mc.clientClose = 0
	mc.forget("the client closed it")
	mc.s.writeOwn(toClient, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_SUCCESS.Enum(),
		Success: &pulsarpb.CommandSuccess{RequestId: proto.Uint64(req)}})
}

// closed is step 3: the broker answered the proxy's CLOSE_CONSUMER.
func (mc *managedConsumer) closed() {
	mc.state = mcAway
	mc.pending = map[wire.EntryID]struct{}{} // a fresh map: the old one may have grown large
	mc.overflow = false
	if mc.clientClose != 0 {
		mc.answerClientClose()
		return
	}
	mc.awayAt = mc.s.nowNS()
	mc.log("managed Key_Shared consumer released; the client resubscribes for its new buckets")
	mc.s.writeOwn(toClient, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_CLOSE_CONSUMER.Enum(),
		CloseConsumer: &pulsarpb.CommandCloseConsumer{ConsumerId: proto.Uint64(mc.id), RequestId: proto.Uint64(^uint64(0))}})
	mc.ticket.Released()
}

// forget removes mc from the session and the manager.
func (mc *managedConsumer) forget(why string) {
	mc.log("managed Key_Shared consumer leaves its subscription", "why", why)
	mc.settleAt, mc.drainAt, mc.retryAt = 0, 0, 0
	mc.s.ksRemove(mc)
	mc.ticket.Leave()
}

// ksRemove drops mc from the session; the session's maps go back to nil when empty, so a
// session without managed consumers pays nothing for them (doc.go contract 7).
func (s *session) ksRemove(mc *managedConsumer) {
	if s.ks[mc.id] == mc {
		delete(s.ks, mc.id)
	}
	if len(s.ks) == 0 {
		s.ks = nil
	}
	for req, x := range s.ksReqs {
		if x == mc && !isOwnID(req) {
			// (The proxy's own requests stay until answered, so the answer is swallowed.)
			delete(s.ksReqs, req)
		}
	}
	if len(s.ksReqs) == 0 {
		s.ksReqs = nil
	}
}

func (s *session) ksRequest(mc *managedConsumer, req uint64) {
	if s.ksReqs == nil {
		s.ksReqs = map[uint64]*managedConsumer{}
	}
	s.ksReqs[req] = mc
}

// writeOwn writes a command the proxy makes towards d, outside or inside a pump. Runs on
// the loop.
func (s *session) writeOwn(d direction, cmd *pulsarpb.BaseCommand) {
	b, err := wire.AppendCommandFrame(nil, cmd)
	if err != nil {
		s.srv.log.Error("encoding a managed Key_Shared command", "err", err)
		return
	}
	s.writeRaw(d, b, true)
}

// writeRaw writes frame b towards d, outside or inside a pump (counted when count is set: a
// frame the proxy made, not one of the client's held back). Runs on the loop.
func (s *session) writeRaw(d direction, b []byte, count bool) {
	inPump := s.pumpBuf != nil
	if !inPump {
		s.pumpFail = nil
	}
	s.writeOut(d, b, count)
	if !inPump && s.pumpFail != nil {
		if s.reason == nil {
			s.reason = fmt.Errorf("writing a managed Key_Shared command: %w", s.pumpFail)
		}
		s.client.Close()
	}
}

// ksFromClient sees the client's consumer frames on a session with managed consumers. Runs
// on the loop, inside the pump.
func (s *session) ksFromClient(f wire.Frame) frameAction {
	t := f.Type()
	switch t {
	case pulsarpb.BaseCommand_FLOW:
		id, ok := wire.ConsumerID(f.Command(), t)
		if mc := s.ks[id]; ok && mc != nil && mc.state >= mcDraining && mc.state != mcLeaving {
			return actDone // released: the broker gets no more permits for it
		}
	case pulsarpb.BaseCommand_ACK, pulsarpb.BaseCommand_REDELIVER_UNACKNOWLEDGED_MESSAGES:
		id, ids, _, all, ok := wire.Acked(f, s.ksIDs[:0])
		s.ksIDs = ids[:0]
		if mc := s.ks[id]; ok && mc != nil {
			if t == pulsarpb.BaseCommand_ACK {
				mc.lastAck = s.nowNS()
			}
			if all {
				clear(mc.pending)
				mc.overflow = false
			}
			for _, e := range ids {
				delete(mc.pending, e)
			}
			mc.checkDrained()
		}
	case pulsarpb.BaseCommand_CLOSE_CONSUMER:
		if wire.DecodeCommand(f, &s.cmd) != nil {
			return actForward
		}
		c := s.cmd.GetCloseConsumer()
		mc := s.ks[c.GetConsumerId()]
		if mc == nil {
			return actForward
		}
		if mc.state == mcHeld || mc.state == mcAway {
			// Nothing of it at the broker: the proxy answers the close itself.
			if mc.state == mcAway && s.nowNS()-mc.awayAt <= int64(resubscribeCloseGrace) {
				// Just told to resubscribe: some clients (pulsar-rs) close the consumer id
				// before they subscribe it again, so the close keeps the consumer's place, as a
				// closed connection does (keyshared contract 4); one that does not come back is
				// rebalanced away after AwayTimeout. Leaving here would rebalance at once,
				// release the other consumers, and with two such clients hand the buckets back
				// and forth for ever.
				s.srv.m.keyShared[ksCloseKept].Add(1)
				mc.log("client closed a managed Key_Shared consumer just told to resubscribe; its place is kept until it resubscribes or the away timeout passes",
					"away_timeout", mc.s.srv.cfg.KeySharedAwayTimeout)
				s.ksRemove(mc)
			} else {
				mc.forget("the client closed it")
			}
			s.writeOwn(toClient, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_SUCCESS.Enum(),
				Success: &pulsarpb.CommandSuccess{RequestId: proto.Uint64(c.GetRequestId())}})
			return actDone
		}
		if mc.state == mcClosing {
			// The proxy's own close is at the broker: the client's is answered when it completes.
			mc.clientClose = c.GetRequestId()
			return actDone
		}
		mc.settleAt, mc.drainAt = 0, 0
		mc.state, mc.reqID = mcLeaving, c.GetRequestId()
		s.ksRequest(mc, mc.reqID)
		if now := s.nowNS(); now-mc.lastAck < int64(ackSettle) {
			// Right behind acknowledgments, a close makes the broker redeliver messages just
			// acknowledged (it applies them asynchronously): the close waits out the settle, as
			// the proxy's own closes do.
			mc.heldClose = append([]byte(nil), f.Bytes()...)
			mc.closeAt = mc.lastAck + int64(ackSettle)
			s.ksArm()
			return actDone
		}
	}
	return actForward
}

// ksFromBroker sees the broker's consumer frames and answers on a session with managed
// consumers. Runs on the loop, inside the pump.
func (s *session) ksFromBroker(f wire.Frame) frameAction {
	t := f.Type()
	switch t {
	case pulsarpb.BaseCommand_MESSAGE:
		a := s.ksMessage(f.Command())
		if a == actDone {
			s.srv.m.keyShared[ksDropped].Add(1)
		}
		return a
	case pulsarpb.BaseCommand_SUCCESS, pulsarpb.BaseCommand_ERROR:
		if len(s.ksReqs) == 0 || wire.DecodeCommand(f, &s.cmd) != nil {
			return actForward
		}
		req := s.cmd.GetSuccess().GetRequestId()
		var ce *pulsarpb.CommandError
		if t == pulsarpb.BaseCommand_ERROR {
			ce = s.cmd.GetError()
			req = ce.GetRequestId()
		}
		mc := s.ksReqs[req]
		if mc == nil {
			return actForward
		}
		delete(s.ksReqs, req)
		if len(s.ksReqs) == 0 {
			s.ksReqs = nil
		}
		if !mc.current() || mc.reqID != req || isOwnID(req) && mc.state != mcClosing {
			if isOwnID(req) {
				return actDone // a close the proxy made for a consumer that has moved on
			}
			return actForward
		}
		return mc.answered(ce)
	case pulsarpb.BaseCommand_CLOSE_CONSUMER:
		id, ok := wire.ConsumerID(f.Command(), t)
		if mc := s.ks[id]; ok && mc != nil && mc.state >= mcSubscribing && mc.state <= mcClosing {
			// The broker closed it (a topic unload), or ended the proxy's own close this way:
			// either way the client resubscribes as after a release, told by this very frame.
			s.srv.m.keyShared[ksBrokerClosed].Add(1)
			mc.settleAt, mc.drainAt = 0, 0
			mc.state, mc.awayAt = mcAway, s.nowNS()
			mc.pending = map[wire.EntryID]struct{}{}
			if mc.clientClose != 0 {
				mc.answerClientClose()
				return actForward
			}
			mc.ticket.Released()
		}
	}
	return actForward
}

// ksMessage tracks a MESSAGE (from its command bytes: the whole frame's, or a cut-through
// head's) and says whether it goes on. A MESSAGE it drops is not cut through: its whole frame
// comes back here (a second read of its command, for a rare frame) and is counted then.
func (s *session) ksMessage(cmd []byte) frameAction {
	id, e, ok := wire.MessageEntry(cmd)
	mc := s.ks[id]
	if !ok || mc == nil {
		return actForward
	}
	switch mc.state {
	case mcClosing, mcAway:
		return actDone // dispatched before the close: the broker redelivers it to the next owner
	}
	if len(mc.pending) < maxTrackedEntries {
		mc.pending[e] = struct{}{}
	} else {
		mc.overflow = true
	}
	mc.checkDrained()
	return actForward
}

// answered takes the broker's answer to what the proxy sent for mc; ce is nil for SUCCESS.
func (mc *managedConsumer) answered(ce *pulsarpb.CommandError) frameAction {
	s := mc.s
	switch mc.state {
	case mcSubscribing:
		if ce == nil {
			mc.state = mcActive
			mc.ticket.Subscribed()
			if mc.release {
				mc.release = false
				s.onLoop(mc.startRelease)
			}
			return actForward // the client's own request id: its answer
		}
		if (ce.GetError() == pulsarpb.ServerError_ConsumerAssignError || ce.GetError() == pulsarpb.ServerError_ConsumerBusy) && mc.retries < subscribeRetries {
			// Most likely the previous owner's close, on another connection, has not reached the
			// broker's dispatcher yet.
			mc.retries++
			s.srv.m.keyShared[ksRetry].Add(1)
			mc.state = mcHeld
			mc.retryAt = s.nowNS() + int64(subscribeRetryDelay)
			s.ksArm()
			return actDone
		}
		mc.forget(fmt.Sprintf("the broker refused its subscribe (%s: %s) after %d retries", ce.GetError(), ce.GetMessage(), mc.retries))
		return actForward
	case mcClosing:
		if ce != nil {
			// The broker knows no such consumer (or refuses the close): either way nothing
			// more is dispatched to it on this connection.
			mc.s.logger().Warn("broker answered the proxy's CLOSE_CONSUMER of a managed Key_Shared consumer with an error; treating it as closed",
				"topic", mc.topic, "subscription", mc.sub, "consumer_id", mc.id, "error", ce.GetError().String(), "message", ce.GetMessage())
		}
		mc.closed()
		return actDone // the proxy's own request
	case mcLeaving:
		mc.forget("the client closed it")
		return actForward
	}
	return actForward
}

// ksClose leaves every managed consumer of a closing session. Runs on the loop.
func (s *session) ksClose() {
	s.ksDeadline.Store(0)
	for _, mc := range s.ks {
		if mc.state == mcAway {
			// Released: clients often resubscribe on a new connection and close this one; the
			// manager keeps the place for the away timeout (keyshared contract 4).
			continue
		}
		mc.log("managed Key_Shared consumer leaves with its connection")
		mc.ticket.Leave()
	}
	s.ks, s.ksReqs = nil, nil
}

func (s *session) nowNS() int64 { return s.srv.clock().UnixNano() }

// ksArm publishes the earliest deadline of the session's managed consumers for the ticker.
// Runs on the loop.
func (s *session) ksArm() {
	var next int64
	for _, mc := range s.ks {
		for _, d := range [...]int64{mc.settleAt, mc.drainAt, mc.retryAt, mc.closeAt} {
			if d != 0 && (next == 0 || d < next) {
				next = d
			}
		}
	}
	s.ksDeadline.Store(next)
}

// ksTickAsync asks the loop to run ksTick. Called from the ticker goroutine once ksDeadline
// has passed.
func (s *session) ksTickAsync() {
	if !s.ksTickQueued.CompareAndSwap(false, true) {
		return
	}
	s.onLoop(func() {
		s.ksTickQueued.Store(false)
		s.ksTick()
	})
}

// ksTick runs the managed consumers' due deadlines. Runs on the loop, outside the pump.
func (s *session) ksTick() {
	now := s.nowNS()
	for _, mc := range s.ks {
		switch {
		case mc.state == mcDraining && mc.settleAt != 0 && now >= mc.settleAt:
			s.srv.m.keyShared[ksDrained].Add(1)
			mc.closeAtBroker()
		case mc.state == mcDraining && mc.drainAt != 0 && now >= mc.drainAt:
			mc.drainExpired()
		case mc.state == mcHeld && mc.retryAt != 0 && now >= mc.retryAt:
			mc.retryAt = 0
			mc.sendSubscribe()
		case mc.state == mcLeaving && mc.closeAt != 0 && now >= mc.closeAt:
			b := mc.heldClose
			mc.heldClose, mc.closeAt = nil, 0
			s.writeRaw(toBroker, b, false)
		}
	}
	s.ksArm()
}
