package rebatch

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/route"
	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/batch"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// mixKeys is Policy.SplitKeys set to false: entries merge across keys.
var mixKeys = func() *bool { b := false; return &b }()

// keyedMsg is a message with any key a client can send: the fields as they go on the wire.
type keyedMsg struct {
	partitionKey *string
	b64          bool
	orderingKey  []byte // nil: absent; non-nil and empty: present and empty
	seq          uint64
}

// randomKeyedMsg draws a key of one of the kinds clients send, from a small pool so that keys
// repeat: absent, UTF-8, present but empty (partition or ordering key), invalid UTF-8 (Go
// strings), raw bytes as ordering key, base64 (Java keyBytes), and base64-flagged garbage
// (which the broker reads as NONE_KEY).
func randomKeyedMsg(r *rand.Rand, seq uint64) keyedMsg {
	m := keyedMsg{seq: seq}
	pool := []byte{0x41, 0x80, 0xbf, 0xc0, 0xc2, 0xe2, 0xed, 0xa0, 0xf0, 0xf4, 0x90, 0xff}
	raw := func() []byte {
		b := make([]byte, 1+r.IntN(3))
		for i := range b {
			b[i] = pool[r.IntN(len(pool))]
		}
		return b
	}
	str := func(s string) *string { return &s }
	switch r.IntN(9) {
	case 0, 1: // keyless
	case 2:
		m.partitionKey = str(fmt.Sprint("k", r.IntN(12)))
	case 3:
		m.partitionKey = str("")
	case 4:
		m.orderingKey = []byte{}
	case 5:
		m.partitionKey = str(string(raw()))
	case 6:
		m.orderingKey = raw()
	case 7:
		m.partitionKey, m.b64 = str(base64.StdEncoding.EncodeToString(raw())), true
	case 8:
		m.partitionKey, m.b64 = str("!!"), true
	}
	return m
}

// directFields is what a broker reads from the message sent alone by producer "p".
func (m keyedMsg) directFields() route.KeyFields {
	return route.KeyFields{OrderingKey: m.orderingKey, HasOrderingKey: m.orderingKey != nil,
		PartitionKey: deref(m.partitionKey), HasPartitionKey: m.partitionKey != nil, PartitionKeyB64: m.b64,
		ProducerName: "p", HasProducerName: true, SequenceID: m.seq, HasSequenceID: true}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// keyedSend encodes msgs as one SEND: a batch, or (one message, single) sent without batching.
func keyedSend(t testing.TB, msgs []keyedMsg, single bool) []byte {
	t.Helper()
	if single {
		m := msgs[0]
		md := &pulsarpb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(m.seq), PublishTime: proto.Uint64(42),
			PartitionKey: m.partitionKey, OrderingKey: m.orderingKey}
		if m.b64 {
			md.PartitionKeyB64Encoded = proto.Bool(true)
		}
		f, err := wire.AppendSendFrameMetadata(nil, &wire.Send{ProducerID: pid, SequenceID: m.seq}, md, []byte(fmt.Sprint(m.seq)))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	var buf []byte
	for _, m := range msgs {
		body := fmt.Sprint(m.seq)
		smm := &pulsarpb.SingleMessageMetadata{SequenceId: proto.Uint64(m.seq), PayloadSize: proto.Int32(int32(len(body))),
			PartitionKey: m.partitionKey, OrderingKey: m.orderingKey}
		if m.b64 {
			smm.PartitionKeyB64Encoded = proto.Bool(true)
		}
		var err error
		if buf, err = batch.AppendNewMessage(buf, smm, []byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	md := &pulsarpb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(msgs[0].seq), PublishTime: proto.Uint64(42),
		NumMessagesInBatch: proto.Int32(int32(len(msgs))), UncompressedSize: proto.Uint32(uint32(len(buf)))}
	s := wire.Send{ProducerID: pid, SequenceID: msgs[0].seq, HighestSequenceID: msgs[len(msgs)-1].seq, NumMessages: int32(len(msgs))}
	f, err := wire.AppendSendFrameMetadata(nil, &s, md, buf)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// outerFields is what the broker's Key_Shared dispatcher reads from an entry the engine built.
func outerFields(md *pulsarpb.MessageMetadata) route.KeyFields {
	return route.KeyFields{OrderingKey: md.OrderingKey, HasOrderingKey: md.OrderingKey != nil,
		PartitionKey: md.GetPartitionKey(), HasPartitionKey: md.PartitionKey != nil, PartitionKeyB64: md.GetPartitionKeyB64Encoded(),
		ProducerName: md.GetProducerName(), HasProducerName: md.ProducerName != nil, SequenceID: md.GetSequenceId(), HasSequenceID: md.SequenceId != nil}
}

func stickyHash(f route.KeyFields) uint32 {
	return route.Murmur3x86_32(route.StickyKey(f), 0) & 0x7FFFFFFF
}

// keySharedScript sends 60 random messages in random sends (batches and single sends) and
// returns them by sequence id, with the entries the engine built.
func keySharedScript(t *testing.T, p *Producer, r *rand.Rand) (map[uint64]keyedMsg, []entry) {
	t.Helper()
	sent := map[uint64]keyedMsg{}
	var out Output
	for seq := uint64(0); seq < 60; {
		n, single := 1+r.IntN(6), r.IntN(3) == 0
		if single {
			n = 1
		}
		var msgs []keyedMsg
		for range n {
			m := randomKeyedMsg(r, seq)
			msgs, sent[seq] = append(msgs, m), m
			seq++
		}
		send(t, p, keyedSend(t, msgs, single), &out)
	}
	if err := p.Flush(&out); err != nil {
		t.Fatal(err)
	}
	return sent, decodeEntries(t, out.Broker)
}

// Given coalesce and properties with their default split_keys, and random sends of every kind
// of key a client can send (absent, empty, invalid UTF-8, raw bytes, base64, bad base64),
// when the engine builds entries,
// then each entry's keyed messages have the sticky hash the broker dispatches the entry by
// (Commands.resolveStickyKey on the outer metadata, Murmur3 with the sign bit cleared), so
// every Key_Shared selector sends the entry where it would send each of them alone.
func TestSplitKeysEntriesRouteAsTheirMessagesAlone(t *testing.T) {
	policies := []Policy{{Kind: Coalesce}, {Kind: Properties, Restricted: map[string][]string{"region": nil}}}
	for _, pol := range policies {
		t.Run(string(pol.Kind), func(t *testing.T) {
			merged := 0
			for script := range 200 {
				r := rand.New(rand.NewPCG(uint64(script), 191))
				sent, entries := keySharedScript(t, newEngine(t, pol, -1), r)
				stored := 0
				for _, e := range entries {
					outer := stickyHash(outerFields(e.md))
					keyedIn := 0
					for _, m := range e.msgs {
						stored++
						k := sent[m.SequenceID]
						if _, keyed, _ := route.MessageKey(k.directFields()); !keyed && !k.b64 {
							continue // keyless: no consumer owns it
						}
						keyedIn++
						if h := stickyHash(k.directFields()); h != outer {
							t.Fatalf("script %d: message %d (%+v) has sticky hash %d, its entry is dispatched by %d (outer %v)",
								script, m.SequenceID, k, h, outer, e.md)
						}
					}
					if keyedIn != 0 && keyedIn != len(e.msgs) {
						t.Fatalf("script %d: entry mixes %d keyed and %d keyless messages", script, keyedIn, len(e.msgs)-keyedIn)
					}
					if keyedIn > 1 {
						merged++
					}
				}
				if stored != len(sent) {
					t.Fatalf("script %d: %d messages in entries, %d sent", script, stored, len(sent))
				}
			}
			if merged == 0 {
				t.Fatal("no entry merged two keyed messages: the property holds vacuously")
			}
		})
	}
}

// Given the buckets policy (8 buckets) and random sends of every kind of key,
// when the engine builds entries,
// then every message is in the lane of the bucket the broker's STICKY selector gives it when
// sent alone (keyless ones by the Pulsar 4 fallback key "<producer>-<sequence id>"), and the
// entry's outer metadata makes the broker dispatch the entry to that same bucket.
func TestBucketEntriesRouteToTheBucketOfEachMessage(t *testing.T) {
	ring, _ := route.NewEqualBuckets(8)
	keyless := map[int]bool{}
	for script := range 200 {
		p, lanes := openBuckets(t, 8, nil)
		r := rand.New(rand.NewPCG(uint64(script), 486))
		sent, entries := keySharedScript(t, p, r)
		for _, e := range entries {
			lane := -1
			for i, id := range lanes {
				if id == e.send.ProducerID {
					lane = i
				}
			}
			outer := ring.Bucket(uint16(stickyHash(outerFields(e.md))))
			if outer != lane {
				t.Fatalf("script %d: entry on lane %d is dispatched to bucket %d (outer %v)", script, lane, outer, e.md)
			}
			for _, m := range e.msgs {
				k := sent[m.SequenceID]
				if b := ring.Bucket(uint16(stickyHash(k.directFields()))); b != lane {
					t.Fatalf("script %d: message %d (%+v) belongs to bucket %d, sent on lane %d", script, m.SequenceID, k, b, lane)
				}
				if _, keyed, _ := route.MessageKey(k.directFields()); !keyed && !k.b64 {
					keyless[lane] = true
				}
			}
		}
	}
	if len(keyless) < 4 {
		t.Fatalf("keyless messages reached only buckets %v: not spread", keyless)
	}
}

// Given engines under coalesce and properties (split_keys) and buckets, warmed up,
// when they classify messages with every kind of key (UTF-8, base64, invalid UTF-8, bad
// base64, ordering key, keyless),
// then classifying allocates nothing (DESIGN.md: no per-message allocation in steady state).
func TestClassifyDoesNotAllocate(t *testing.T) {
	bucketsEngine, _ := openBuckets(t, 4, nil)
	properties := newEngine(t, Policy{Kind: Properties, Restricted: map[string][]string{"region": nil}}, -1)
	for _, p := range []*Producer{newEngine(t, Policy{Kind: Coalesce}, -1), properties, bucketsEngine} {
		str := func(s string) *string { return &s }
		var msgs []msgRef
		for i, k := range []keyedMsg{{partitionKey: str("k")}, {partitionKey: str("AAEC/w=="), b64: true}, {partitionKey: str("\xff\xe2\x82")},
			{partitionKey: str("!!"), b64: true}, {orderingKey: []byte{1, 2}}, {}} {
			k.seq = uint64(i)
			f := frame(t, keyedSend(t, []keyedMsg{k}, false))
			it := batch.NewIterator(f.Payload(), 1)
			for it.Next() {
				msgs = append(msgs, msgRef{smm: bytes.Clone(it.Message().Metadata), meta: it.Meta(), payload: bytes.Clone(it.Message().Payload), seq: k.seq})
			}
		}
		step := func() {
			for i := range msgs {
				p.arena = p.arena[:0]
				var pm planned
				p.classify(&msgs[i], &pm)
			}
		}
		step()
		if n := testing.AllocsPerRun(200, step); n != 0 {
			t.Errorf("%s: %v allocations per %d messages classified", p.cfg.Policy.Kind, n, len(msgs))
		}
	}
}
