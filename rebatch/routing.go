package rebatch

import (
	"encoding/binary"
	"strconv"
	"unicode/utf8"

	"github.com/rebatchproxy/rebatchproxy/route"
	"github.com/rebatchproxy/rebatchproxy/wire/batch"
)

// Key_Shared routing of built entries (DESIGN.md contract 5).
//
// The broker dispatches an entry on a Key_Shared subscription by one key, the one its outer
// metadata resolves to (Commands.resolveStickyKey: ordering key, else partition key read as a
// Java String or base64-decoded, else "<producer>-<sequence id>" on Pulsar 4, else NONE_KEY),
// and never looks inside a batch. So an entry holding messages of several keys sends all of
// them to the owner of one. Two rules keep consumers from telling the proxy is there:
//
//   - KeysApart (coalesce and properties by default): an entry's keyed messages share the hash
//     the broker dispatches by, the Murmur3 of the sticky key with the sign bit cleared, from
//     which every selector (consistent hashing, auto-split or sticky ranges, 3.x and 4.x)
//     derives its slot. Keyless messages, which no consumer can own, merge only with each
//     other. The price is entries per message on keyed workloads: only runs of one key merge.
//   - Buckets: a message's bucket is that of the hashB of its sticky key, and the entry's
//     outer ordering key is the sticky key of its first message, so the broker hashes exactly
//     the bytes the bucket was chosen by: an invalid-UTF-8 partition key as the JDK repairs it,
//     an empty key as empty (present, never dropped), a keyless message by the key a Pulsar 4
//     broker gives it directly, "<client producer name>-<sequence id>", which spreads keyless
//     messages over the buckets as the broker spreads them.

// routeOf returns the bytes the broker hashes to dispatch a message sent alone, and whether
// the message has a key of its own; meta is its parsed metadata. Keyless
// messages get the Pulsar 4 fallback key only under
// buckets (where it picks the bucket); elsewhere key is nil for them. The key aliases the
// message or scratch space until the next call.
func (p *Producer) routeOf(meta *batch.SingleMeta, seq uint64) (key []byte, keyed bool) {
	switch {
	case meta.HasOrderingKey:
		return nonNil(meta.OrderingKey), true
	case meta.HasPartitionKey && !meta.PartitionKeyB64Encoded && utf8.Valid(meta.PartitionKey):
		return nonNil(meta.PartitionKey), true
	case meta.HasPartitionKey:
		// Base64 (Java's keyBytes) or invalid UTF-8, decoded into scratch space.
		var err error
		if p.keyBuf, err = route.AppendPartitionKey(p.keyBuf[:0], meta.PartitionKey, meta.PartitionKeyB64Encoded); err != nil {
			return noneKey, true // the broker logs the bad base64 and hashes NONE_KEY
		}
		return nonNil(p.keyBuf), true
	}
	if p.ring == nil {
		return nil, false
	}
	// route.StickyKey's fallback, built in scratch space: keyless sends are the common case.
	p.fallback = append(append(p.fallback[:0], p.cfg.ProducerName...), '-')
	p.fallback = strconv.AppendInt(p.fallback, int64(seq), 10)
	return p.fallback, false
}

// classify fills pm with a message's bucket, hash and group, appending the group (and, under
// buckets, the routing key) to p.arena. A group is what every message of one entry shares:
// under KeysApart a routing class first (0 for keyless; 1 and the 31-bit sticky hash, little
// endian, for keyed), then the restricted properties (groupOf).
func (p *Producer) classify(m *msgRef, pm *planned) {
	apart := p.cfg.Policy.KeysApart()
	meta := &m.meta // parsed once, when the send was taken apart
	if p.ring != nil || apart {
		key, keyed := p.routeOf(meta, m.seq)
		if p.ring != nil {
			pm.hash, pm.hasHash = route.HashB(key), true
			pm.lane = 1 + p.ring.Bucket(pm.hash)
			pm.keyLo = len(p.arena)
			p.arena = append(p.arena, key...)
			pm.keyHi = len(p.arena)
		}
		pm.groupLo = len(p.arena)
		if apart {
			if keyed {
				p.arena = append(p.arena, 1)
				p.arena = binary.LittleEndian.AppendUint32(p.arena, route.Murmur3x86_32(key, 0)&0x7FFFFFFF)
			} else {
				p.arena = append(p.arena, 0)
			}
		}
	} else {
		pm.groupLo = len(p.arena)
	}
	p.arena = append(p.arena, p.groupOf(meta)...)
	pm.group = len(p.arena)
}

// routeLen is the length of the routing class at the start of a group classify built under
// this engine's policy (0 without KeysApart). The open batch keeps the value of the engine
// that opened it: on a shared lane, engines made before and after a SIGHUP may disagree.
func (p *Producer) routeLen(group []byte) int {
	switch {
	case !p.cfg.Policy.KeysApart() || len(group) == 0:
		return 0
	case group[0] == 1:
		return 5
	}
	return 1
}

// sameRoute reports whether a message's group (from this engine) and an open batch's have the
// same routing class.
func (p *Producer) sameRoute(group []byte, o *openBatch) bool {
	n := p.routeLen(group)
	return n == o.routeLen && string(group[:n]) == string(o.group[:n])
}

// noneKey is the broker's key of last resort (Commands.NONE_KEY).
var noneKey = []byte("NONE_KEY")

// nonNil keeps a present but empty key present: a nil slice would drop the field.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
