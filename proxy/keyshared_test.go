package proxy

import (
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/keyshared"
	"github.com/rebatchproxy/rebatchproxy/route"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// Specs of managed Key_Shared subscriptions (keyshared.go) on the connection core: raw frames
// in, raw frames out, on the injected clock.

const ksTopic = "persistent://t/n/managed"

// managedCore is an established session of a server that manages ksTopic with 4 buckets.
func managedCore(t *testing.T) *memLoop {
	t.Helper()
	return managedCoreWith(t, func(*Config) {})
}

// managedCoreWith is managedCore with more configuration.
func managedCoreWith(t *testing.T, configure func(*Config)) *memLoop {
	t.Helper()
	ring, err := route.NewEqualBuckets(4)
	if err != nil {
		t.Fatal(err)
	}
	return established(t, func(c *Config) {
		c.ManagedKeyShared = func(topic string) keyshared.Ring {
			if topic == ksTopic {
				return ring
			}
			return nil
		}
		configure(c)
	})
}

func ksSubscribe(consumer, req uint64, name string) *pulsarpb.BaseCommand {
	return &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_SUBSCRIBE.Enum(), Subscribe: &pulsarpb.CommandSubscribe{
		Topic: proto.String(ksTopic), Subscription: proto.String("s"), SubType: pulsarpb.CommandSubscribe_Key_Shared.Enum(),
		ConsumerId: proto.Uint64(consumer), RequestId: proto.Uint64(req), ConsumerName: proto.String(name),
		KeySharedMeta: &pulsarpb.KeySharedMeta{KeySharedMode: pulsarpb.KeySharedMode_AUTO_SPLIT.Enum()}}}
}

func ksSuccess(req uint64) *pulsarpb.BaseCommand {
	return &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_SUCCESS.Enum(), Success: &pulsarpb.CommandSuccess{RequestId: proto.Uint64(req)}}
}

func ksFlow(consumer uint64) *pulsarpb.BaseCommand {
	return &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_FLOW.Enum(), Flow: &pulsarpb.CommandFlow{
		ConsumerId: proto.Uint64(consumer), MessagePermits: proto.Uint32(1000)}}
}

func ksMessage(consumer, entry uint64) *pulsarpb.BaseCommand {
	return &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_MESSAGE.Enum(), Message: &pulsarpb.CommandMessage{
		ConsumerId: proto.Uint64(consumer), MessageId: &pulsarpb.MessageIdData{LedgerId: proto.Uint64(9), EntryId: proto.Uint64(entry)}}}
}

func ksAck(consumer uint64, entries ...uint64) *pulsarpb.BaseCommand {
	a := &pulsarpb.CommandAck{ConsumerId: proto.Uint64(consumer), AckType: pulsarpb.CommandAck_Individual.Enum()}
	for _, e := range entries {
		a.MessageId = append(a.MessageId, &pulsarpb.MessageIdData{LedgerId: proto.Uint64(9), EntryId: proto.Uint64(e)})
	}
	return &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_ACK.Enum(), Ack: a}
}

// stickyRanges returns the hash ranges of a STICKY SUBSCRIBE, or nil for another.
func stickyRanges(c *pulsarpb.BaseCommand) [][2]int32 {
	ks := c.GetSubscribe().GetKeySharedMeta()
	if ks.GetKeySharedMode() != pulsarpb.KeySharedMode_STICKY {
		return nil
	}
	var out [][2]int32
	for _, r := range ks.GetHashRanges() {
		out = append(out, [2]int32{r.GetStart(), r.GetEnd()})
	}
	return out
}

// Given a server managing a topic of 4 buckets,
// when a client subscribes to it Key_Shared in AUTO_SPLIT mode,
// then the broker gets the SUBSCRIBE as STICKY over the whole ring, under the client's request
// id, and the broker's answer reaches the client.
func TestCoreManagedSubscribeGoesOutAsStickyWholeBuckets(t *testing.T) {
	l := managedCore(t)

	l.feed(l.client, frame(t, ksSubscribe(1, 10, "a")))

	got := decodeAll(t, l.broker.take())
	if len(got) != 1 || got[0].GetSubscribe().GetRequestId() != 10 || len(stickyRanges(got[0])) != 1 || stickyRanges(got[0])[0] != [2]int32{0, 65535} {
		t.Fatalf("broker got %v", got)
	}
	l.feed(l.broker, frame(t, ksSuccess(10)))
	if got := decodeAll(t, l.client.take()); len(got) != 1 || got[0].GetSuccess().GetRequestId() != 10 {
		t.Fatalf("client got %v", got)
	}
}

// Given a server managing a topic of 4 buckets,
// when a client subscribes to it Key_Shared STICKY without ranges,
// then the SUBSCRIBE reaches the broker unchanged, for it to refuse as it would directly
// ("Ranges for KeyShared policy must not be empty"), not managed into a working one.
func TestCoreStickySubscribeWithoutRangesIsTheBrokersToJudge(t *testing.T) {
	l := managedCore(t)
	sub := ksSubscribe(1, 10, "a")
	sub.GetSubscribe().GetKeySharedMeta().KeySharedMode = pulsarpb.KeySharedMode_STICKY.Enum()

	l.feed(l.client, frame(t, sub))

	got := decodeAll(t, l.broker.take())
	if len(got) != 1 || !proto.Equal(got[0], sub) {
		t.Fatalf("broker got %v, want the client's SUBSCRIBE unchanged", got)
	}
}

// Given a server managing a topic of 4 buckets,
// when a client subscribes to it Key_Shared with options of its own (out-of-order delivery,
// PIP-486's entry bucket dispatch, and a field this build does not know),
// then the SUBSCRIBE the broker gets keeps them all; only the mode and the ranges change.
func TestCoreManagedSubscribeKeepsTheClientsKeySharedOptions(t *testing.T) {
	l := managedCore(t)
	sub := ksSubscribe(1, 10, "a")
	ks := sub.GetSubscribe().GetKeySharedMeta()
	ks.AllowOutOfOrderDelivery, ks.EntryBucketDispatch = proto.Bool(true), proto.Bool(true)
	ks.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 9, protowire.VarintType), 7))

	l.feed(l.client, frame(t, sub))

	got := decodeAll(t, l.broker.take())
	if len(got) != 1 || len(stickyRanges(got[0])) != 1 {
		t.Fatalf("broker got %v", got)
	}
	out := got[0].GetSubscribe().GetKeySharedMeta()
	if !out.GetAllowOutOfOrderDelivery() || !out.GetEntryBucketDispatch() || len(out.ProtoReflect().GetUnknown()) == 0 {
		t.Fatalf("the client's key-shared options were dropped: %v", out)
	}
}

// Given a managed consumer holding every bucket, with two entries delivered and not yet
// acknowledged,
// when a second consumer of the subscription subscribes,
// then the first is drained before its buckets move: its FLOW no longer reaches the broker,
// the proxy closes it at the broker only once both entries are acknowledged and the ack
// settle has passed, drops a MESSAGE the broker still sends it, tells the client to
// resubscribe (CLOSE_CONSUMER), and only then sends the second consumer's SUBSCRIBE (upper
// half); the first's resubscribe gets the lower half.
func TestCoreManagedHandoffDrainsTheOwnerBeforeMovingBuckets(t *testing.T) {
	l := managedCore(t)
	l.feed(l.client, frame(t, ksSubscribe(1, 10, "a")))
	l.feed(l.broker, frame(t, ksSuccess(10)))
	l.feed(l.broker, frame(t, ksMessage(1, 1)), frame(t, ksMessage(1, 2)))
	l.client.take()
	l.broker.take()

	l.feed(l.client, frame(t, ksSubscribe(2, 11, "b")))

	if got := decodeAll(t, l.broker.take()); len(got) != 0 {
		t.Fatalf("broker got %v while the first consumer still holds the buckets", got)
	}
	l.feed(l.client, frame(t, ksFlow(1)), frame(t, ksAck(1, 1)))
	if got := decodeAll(t, l.broker.take()); len(got) != 1 || got[0].GetType() != pulsarpb.BaseCommand_ACK {
		t.Fatalf("broker got %v; want the ACK alone (FLOW withheld)", got)
	}
	l.feed(l.client, frame(t, ksAck(1, 2)))
	l.broker.take()
	l.tick(100 * time.Millisecond)
	if got := decodeAll(t, l.broker.take()); len(got) != 0 {
		t.Fatalf("broker got %v before the ack settle passed", got)
	}
	l.tick(150 * time.Millisecond)
	got := decodeAll(t, l.broker.take())
	if len(got) != 1 || got[0].GetCloseConsumer().GetConsumerId() != 1 || !isOwnID(got[0].GetCloseConsumer().GetRequestId()) {
		t.Fatalf("broker got %v; want the proxy's CLOSE_CONSUMER of consumer 1", got)
	}
	closeReq := got[0].GetCloseConsumer().GetRequestId()
	l.feed(l.broker, frame(t, ksMessage(1, 3)))
	if got := decodeAll(t, l.client.take()); len(got) != 0 {
		t.Fatalf("client got %v from a consumer being closed", got)
	}
	l.feed(l.broker, frame(t, ksSuccess(closeReq)))
	if got := decodeAll(t, l.client.take()); len(got) != 1 || got[0].GetCloseConsumer().GetConsumerId() != 1 {
		t.Fatalf("client got %v; want CLOSE_CONSUMER of consumer 1", got)
	}
	got = decodeAll(t, l.broker.take())
	if len(got) != 1 || got[0].GetSubscribe().GetConsumerId() != 2 || stickyRanges(got[0])[0] != [2]int32{32768, 65535} {
		t.Fatalf("broker got %v; want consumer 2's SUBSCRIBE for the upper half", got)
	}
	l.feed(l.client, frame(t, ksSubscribe(1, 12, "a")))
	got = decodeAll(t, l.broker.take())
	if len(got) != 1 || got[0].GetSubscribe().GetConsumerId() != 1 || stickyRanges(got[0])[0] != [2]int32{0, 32767} {
		t.Fatalf("broker got %v; want consumer 1's resubscribe for the lower half", got)
	}
}

// Given a managed consumer being drained that never acknowledges what it was sent,
// when the handoff timeout passes,
// then the proxy closes it at the broker anyway (the broker redelivers), and counts it.
func TestCoreManagedHandoffTimesOut(t *testing.T) {
	l := managedCore(t)
	l.feed(l.client, frame(t, ksSubscribe(1, 10, "a")))
	l.feed(l.broker, frame(t, ksSuccess(10)), frame(t, ksMessage(1, 1)))
	l.feed(l.client, frame(t, ksSubscribe(2, 11, "b")))
	l.broker.take()

	l.tick(l.srv.cfg.HandoffTimeout + time.Millisecond)

	got := decodeAll(t, l.broker.take())
	if len(got) != 1 || got[0].GetCloseConsumer().GetConsumerId() != 1 {
		t.Fatalf("broker got %v; want CLOSE_CONSUMER of consumer 1", got)
	}
	if n := l.srv.m.keyShared[ksDrainTimeout].Load(); n != 1 {
		t.Fatalf("drain timeouts counted %d, want 1", n)
	}
}

// releasedAndMoved is managedCore after a handoff: consumer 1 ("a") was released for consumer
// 2 ("b"), told to resubscribe (CLOSE_CONSUMER), and consumer 2 holds the upper half at the
// broker. Both directions' output is taken.
func releasedAndMoved(t *testing.T, configure func(*Config)) *memLoop {
	t.Helper()
	l := managedCoreWith(t, configure)
	l.feed(l.client, frame(t, ksSubscribe(1, 10, "a")))
	l.feed(l.broker, frame(t, ksSuccess(10)))
	l.feed(l.client, frame(t, ksSubscribe(2, 11, "b")))
	l.tick(250 * time.Millisecond)
	got := decodeAll(t, l.broker.take())
	l.client.take()
	l.feed(l.broker, frame(t, ksSuccess(got[len(got)-1].GetCloseConsumer().GetRequestId())))
	if got := decodeAll(t, l.client.take()); len(got) != 1 || got[0].GetCloseConsumer().GetConsumerId() != 1 {
		t.Fatalf("client got %v; want CLOSE_CONSUMER of consumer 1", got)
	}
	if got := decodeAll(t, l.broker.take()); len(got) != 1 || got[0].GetSubscribe().GetConsumerId() != 2 {
		t.Fatalf("broker got %v; want consumer 2's SUBSCRIBE", got)
	}
	l.feed(l.broker, frame(t, ksSuccess(11)))
	l.client.take()
	return l
}

func ksClose(consumer, req uint64) *pulsarpb.BaseCommand {
	return &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_CLOSE_CONSUMER.Enum(),
		CloseConsumer: &pulsarpb.CommandCloseConsumer{ConsumerId: proto.Uint64(consumer), RequestId: proto.Uint64(req)}}
}

// Given a managed consumer released for a rebalance and told to resubscribe, while another
// consumer holds the buckets it gave up,
// when its client closes that consumer id at once (pulsar-rs closes before it resubscribes),
// then the proxy answers the close itself, counts it, the consumer keeps its place (the other consumer is
// not released: nothing reaches the broker), and the client's resubscribe under the same name
// gets the lower half back at once.
func TestCoreManagedCloseOfAReleasedConsumerKeepsItsPlace(t *testing.T) {
	l := releasedAndMoved(t, func(*Config) {})

	l.feed(l.client, frame(t, ksClose(1, 13)))

	if got := decodeAll(t, l.client.take()); len(got) != 1 || got[0].GetSuccess().GetRequestId() != 13 {
		t.Fatalf("client got %v; want SUCCESS for its close", got)
	}
	if n := l.srv.m.keyShared[ksCloseKept].Load(); n != 1 {
		t.Fatalf("client_close_kept counted %d, want 1", n)
	}
	l.tick(250 * time.Millisecond)
	if got := decodeAll(t, l.broker.take()); len(got) != 0 {
		t.Fatalf("broker got %v; the consumer holding the upper half should stay as it is", got)
	}
	l.feed(l.client, frame(t, ksSubscribe(1, 14, "a")))
	got := decodeAll(t, l.broker.take())
	if len(got) != 1 || got[0].GetSubscribe().GetConsumerId() != 1 || stickyRanges(got[0])[0] != [2]int32{0, 32767} {
		t.Fatalf("broker got %v; want consumer 1's resubscribe for the lower half", got)
	}
}

// Given a managed consumer released for a rebalance, whose client closed it at once,
// when it does not resubscribe within the away timeout,
// then the subscription is rebalanced without it, and only then: the remaining consumer is
// released to take the whole ring.
func TestCoreManagedClosedReleasedConsumerIsRebalancedAwayAfterTheAwayTimeout(t *testing.T) {
	l := releasedAndMoved(t, func(c *Config) { c.KeySharedAwayTimeout = 300 * time.Millisecond })
	l.feed(l.client, frame(t, ksClose(1, 13)))
	l.client.take()
	l.tick(250 * time.Millisecond)
	if got := decodeAll(t, l.broker.take()); len(got) != 0 {
		t.Fatalf("broker got %v before the away timeout", got)
	}

	time.Sleep(400 * time.Millisecond) // the manager's away timer runs on the real clock

	l.settle()
	l.tick(250 * time.Millisecond)
	got := decodeAll(t, l.broker.take())
	if len(got) != 1 || got[0].GetCloseConsumer().GetConsumerId() != 2 || !isOwnID(got[0].GetCloseConsumer().GetRequestId()) {
		t.Fatalf("broker got %v; want the proxy's CLOSE_CONSUMER of consumer 2 (released to take the whole ring)", got)
	}
}

// Given a managed consumer released for a rebalance and told to resubscribe,
// when its client closes it only after resubscribeCloseGrace (the application closing it,
// not a client's first step of a resubscribe),
// then the consumer leaves at once: the remaining consumer is released to take the whole ring.
func TestCoreManagedLateCloseOfAReleasedConsumerLeaves(t *testing.T) {
	l := releasedAndMoved(t, func(*Config) {})
	l.tick(resubscribeCloseGrace + time.Millisecond)

	l.feed(l.client, frame(t, ksClose(1, 13)))

	if got := decodeAll(t, l.client.take()); len(got) != 1 || got[0].GetSuccess().GetRequestId() != 13 {
		t.Fatalf("client got %v; want SUCCESS for its close", got)
	}
	l.tick(250 * time.Millisecond)
	got := decodeAll(t, l.broker.take())
	if len(got) != 1 || got[0].GetCloseConsumer().GetConsumerId() != 2 || !isOwnID(got[0].GetCloseConsumer().GetRequestId()) {
		t.Fatalf("broker got %v; want the proxy's CLOSE_CONSUMER of consumer 2 (released to take the whole ring)", got)
	}
}

// Given a managed consumer whose Release reaches its loop before its Grant (the manager's
// callbacks come from different goroutines and may be reordered),
// when the Grant arrives and the broker accepts the subscribe,
// then the consumer is drained and closed at the broker anyway: the release is not lost.
func TestCoreManagedReleaseBeforeGrantIsKept(t *testing.T) {
	l := managedCore(t)
	l.client.in = append(l.client.in, frame(t, ksSubscribe(1, 10, "a"))...)
	l.input(l.client) // the Grant is queued, not yet run
	l.s.ks[1].startRelease()

	l.settle()
	l.feed(l.broker, frame(t, ksSuccess(10)))
	l.broker.take()
	l.tick(250 * time.Millisecond)

	got := decodeAll(t, l.broker.take())
	if len(got) != 1 || got[0].GetCloseConsumer().GetConsumerId() != 1 {
		t.Fatalf("broker got %v; want the proxy's CLOSE_CONSUMER of consumer 1", got)
	}
}

// Given a managed consumer the proxy is closing at the broker for a handoff,
// when the client closes it too,
// then the client's close is not sent on; once the broker answers the proxy's close, the
// client gets SUCCESS under its own request id and nothing under the proxy's.
func TestCoreManagedClientCloseDuringHandoffIsAnsweredByTheProxy(t *testing.T) {
	l := managedCore(t)
	l.feed(l.client, frame(t, ksSubscribe(1, 10, "a")))
	l.feed(l.broker, frame(t, ksSuccess(10)))
	l.feed(l.client, frame(t, ksSubscribe(2, 11, "b")))
	l.tick(250 * time.Millisecond)
	got := decodeAll(t, l.broker.take())
	closeReq := got[len(got)-1].GetCloseConsumer().GetRequestId()
	l.client.take()

	l.feed(l.client, frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_CLOSE_CONSUMER.Enum(),
		CloseConsumer: &pulsarpb.CommandCloseConsumer{ConsumerId: proto.Uint64(1), RequestId: proto.Uint64(12)}}))

	if got := decodeAll(t, l.broker.take()); len(got) != 0 {
		t.Fatalf("broker got %v; the client's close should wait for the proxy's", got)
	}
	l.feed(l.broker, frame(t, ksSuccess(closeReq)))
	got = decodeAll(t, l.client.take())
	if len(got) != 1 || got[0].GetSuccess().GetRequestId() != 12 {
		t.Fatalf("client got %v; want SUCCESS for its request 12 only", got)
	}
}

// Given a managed consumer that has just acknowledged an entry,
// when its client closes it,
// then the close reaches the broker only once the ack settle has passed (a close right behind
// acknowledgments makes the broker redeliver them), and the broker's answer reaches the client.
func TestCoreManagedClientCloseWaitsOutTheAckSettle(t *testing.T) {
	l := managedCore(t)
	l.feed(l.client, frame(t, ksSubscribe(1, 10, "a")))
	l.feed(l.broker, frame(t, ksSuccess(10)), frame(t, ksMessage(1, 1)))
	l.feed(l.client, frame(t, ksAck(1, 1)))
	l.broker.take()
	l.client.take()

	l.feed(l.client, frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_CLOSE_CONSUMER.Enum(),
		CloseConsumer: &pulsarpb.CommandCloseConsumer{ConsumerId: proto.Uint64(1), RequestId: proto.Uint64(12)}}))

	if got := decodeAll(t, l.broker.take()); len(got) != 0 {
		t.Fatalf("broker got %v right behind the ACK", got)
	}
	l.tick(250 * time.Millisecond)
	if got := decodeAll(t, l.broker.take()); len(got) != 1 || got[0].GetCloseConsumer().GetRequestId() != 12 {
		t.Fatalf("broker got %v; want the client's CLOSE_CONSUMER after the settle", got)
	}
	l.feed(l.broker, frame(t, ksSuccess(12)))
	if got := decodeAll(t, l.client.take()); len(got) != 1 || got[0].GetSuccess().GetRequestId() != 12 {
		t.Fatalf("client got %v", got)
	}
}

// DESIGN contract 7 (bounded memory).
// Given a managed consumer sent more entries than the proxy tracks (maxTrackedEntries),
// when a rebalance releases it and it acknowledges every entry,
// then the tracking stayed bounded, and the proxy, no longer able to tell that nothing is
// unacknowledged, closes it only at the handoff timeout.
func TestCoreManagedTrackingIsBounded(t *testing.T) {
	l := managedCore(t)
	l.feed(l.client, frame(t, ksSubscribe(1, 10, "a")))
	l.feed(l.broker, frame(t, ksSuccess(10)))
	var msgs, acks []byte
	for e := uint64(0); e < maxTrackedEntries+10; e++ {
		msgs = append(msgs, frame(t, ksMessage(1, e))...)
		acks = append(acks, frame(t, ksAck(1, e))...)
	}
	l.feed(l.broker, msgs)
	if n := len(l.s.ks[1].pending); n > maxTrackedEntries {
		t.Fatalf("%d entries tracked, limit %d", n, maxTrackedEntries)
	}
	l.feed(l.client, frame(t, ksSubscribe(2, 11, "b")))
	l.feed(l.client, acks)
	l.broker.take()

	l.tick(time.Second)
	if got := decodeAll(t, l.broker.take()); len(got) != 0 {
		t.Fatalf("broker got %v before the handoff timeout", got)
	}
	l.tick(l.srv.cfg.HandoffTimeout)
	if got := decodeAll(t, l.broker.take()); len(got) != 1 || got[0].GetCloseConsumer().GetConsumerId() != 1 {
		t.Fatalf("broker got %v; want CLOSE_CONSUMER of consumer 1 at the timeout", got)
	}
}
