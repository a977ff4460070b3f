package rebatch

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/rebatchproxy/rebatchproxy/route"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// Kind names a producer-path policy.
type Kind string

// The policies of DESIGN.md section 2.
const (
	// Passthrough forwards every frame unchanged; the engine is not used.
	Passthrough Kind = "passthrough"
	// Coalesce merges consecutive sends of one producer into batches, in order.
	Coalesce Kind = "coalesce"
	// Properties groups consecutive messages by their restricted properties (PIP-191).
	Properties Kind = "properties"
	// Buckets batches per hash bucket of the message key (PIP-486): one open batch, and one
	// broker producer, per bucket.
	Buckets Kind = "buckets"
)

// Defaults for the batch limits. MaxDelay is short because a producer waiting for a receipt
// waits for the flush too; MaxMessages and MaxBytes follow the clients' own batch limits.
const (
	DefaultMaxMessages = 1000
	DefaultMaxBytes    = 128 << 10
	DefaultMaxDelay    = 2 * time.Millisecond
)

// MaxBuckets bounds the buckets of one policy: each bucket is a broker producer per client
// producer.
const MaxBuckets = 256

// ErrInvalidPolicy is wrapped by every policy validation error.
var ErrInvalidPolicy = errors.New("rebatch: invalid policy")

// Policy is the configuration of one rewriting policy.
type Policy struct {
	Kind Kind
	// MaxMessages, MaxBytes and MaxDelay bound an open batch; zero means the default.
	// MaxBytes counts the uncompressed batch payload and is further capped by the broker's
	// max_message_size.
	MaxMessages int
	MaxBytes    int
	MaxDelay    time.Duration
	// Restricted lists, for the properties policy, the property keys that split batches and
	// the values that count for each (an empty list means any value), as PIP-191's
	// restrictSameValuesInBatchProperties.
	Restricted map[string][]string
	// Compression of the entries the engine builds; nil keeps the codec of the first client
	// send in the entry.
	Compression *pulsarpb.CompressionType
	// MergeProducers (coalesce only) merges the messages of every client producer of a topic on
	// one client connection into shared entries, written by a proxy-owned broker producer.
	// Synchronous producers (one message, then wait for the receipt) gain only from this. The
	// price: the shared producer's sequence ids are the proxy's, so after any reconnect broker
	// de-duplication cannot recognise a client's resend (at-least-once, not exactly-once), and
	// consumers see the shared producer's name on those messages.
	MergeProducers bool
	// HoldWhenIdle keeps a batch open for MaxDelay even when the broker has nothing of this
	// lane in flight. By default (false) a batch is sent as soon as the lane is idle and the
	// next one fills while that entry is in flight (group commit): batches grow with the
	// broker's latency instead of adding MaxDelay to every send.
	HoldWhenIdle bool
	// MaxPendingSends bounds each client producer's sends awaiting receipts (Config's field
	// of that name); zero means the default, 100,000.
	MaxPendingSends int

	// SplitKeys keeps messages whose Key_Shared routing differs out of one entry: an entry's
	// keyed messages then share the hash the broker dispatches by (Murmur3 of the sticky key,
	// sign bit cleared), so every Key_Shared selector (AUTO_SPLIT, STICKY, any broker version)
	// sends the entry where it would send each of them alone, and keys reach one consumer as
	// directly. Keyless messages merge only with keyless ones. nil means the default: on for
	// coalesce and properties, off for buckets (whose entries mix the keys of one bucket, for
	// consumers whose ranges are aligned to the buckets). See KeysApart.
	SplitKeys *bool

	// ManageKeyShared (buckets only; nil means on) makes the proxy manage the topic's
	// Key_Shared subscriptions whose consumers did not align themselves (AUTO_SPLIT, or STICKY
	// without ranges): their SUBSCRIBE goes to the broker as STICKY with ranges of whole buckets,
	// assigned and rebalanced by the proxy (package keyshared). See ManagesKeyShared.
	ManageKeyShared *bool

	// Buckets is the number of equal-width buckets over the 16-bit hashB ring (buckets
	// policy); BucketStarts gives explicit boundaries instead (first 0, strictly increasing).
	Buckets      int
	BucketStarts []int

	ring *route.Buckets // compiled by Validate
}

// KeysApart reports whether entries keep messages of different Key_Shared routing apart
// (SplitKeys, with its default). Any goroutine may call it.
func (p *Policy) KeysApart() bool {
	if p.SplitKeys != nil {
		return *p.SplitKeys
	}
	return p.Kind == Coalesce || p.Kind == Properties
}

// ManagesKeyShared reports whether the proxy manages the topic's unaligned Key_Shared
// subscriptions (ManageKeyShared, with its default: on for buckets). Any goroutine may call it.
func (p *Policy) ManagesKeyShared() bool {
	if p.Kind != Buckets {
		return false
	}
	return p.ManageKeyShared == nil || *p.ManageKeyShared
}

// Ring returns the compiled buckets of a validated buckets policy.
func (p *Policy) Ring() *route.Buckets { return p.ring }

// Validate checks a policy and fills in defaults. Errors wrap ErrInvalidPolicy and name the
// offending field.
func (p *Policy) Validate() error {
	switch p.Kind {
	case Coalesce, Properties, Buckets:
	case Passthrough:
		return nil
	default:
		return fmt.Errorf("%w: kind %q (want passthrough, coalesce, properties or buckets)", ErrInvalidPolicy, p.Kind)
	}
	if p.MaxMessages < 0 || p.MaxBytes < 0 || p.MaxDelay < 0 || p.MaxPendingSends < 0 {
		return fmt.Errorf("%w: max_messages, max_bytes, max_delay and max_pending_sends must not be negative", ErrInvalidPolicy)
	}
	if p.MaxMessages == 0 {
		p.MaxMessages = DefaultMaxMessages
	}
	if p.MaxBytes == 0 {
		p.MaxBytes = DefaultMaxBytes
	}
	if p.MaxDelay == 0 {
		p.MaxDelay = DefaultMaxDelay
	}
	if p.Kind == Properties && len(p.Restricted) == 0 {
		return fmt.Errorf("%w: restricted: the properties policy needs at least one restricted key", ErrInvalidPolicy)
	}
	if p.Kind != Properties && len(p.Restricted) > 0 {
		return fmt.Errorf("%w: restricted: only the properties policy takes restricted keys", ErrInvalidPolicy)
	}
	for k := range p.Restricted {
		if k == "" {
			return fmt.Errorf("%w: restricted: empty property key", ErrInvalidPolicy)
		}
	}
	if p.Kind == Buckets {
		var err error
		switch {
		case len(p.BucketStarts) > 0 && p.Buckets > 0 && p.Buckets != len(p.BucketStarts):
			return fmt.Errorf("%w: buckets: %d buckets but %d bucket_starts", ErrInvalidPolicy, p.Buckets, len(p.BucketStarts))
		case len(p.BucketStarts) > 0:
			p.ring, err = route.NewBuckets(p.BucketStarts)
		case p.Buckets > 0:
			p.ring, err = route.NewEqualBuckets(p.Buckets)
		default:
			return fmt.Errorf("%w: buckets: the buckets policy needs buckets (a count) or bucket_starts", ErrInvalidPolicy)
		}
		if err != nil {
			return fmt.Errorf("%w: buckets: %v", ErrInvalidPolicy, err)
		}
		if p.ring.Len() > MaxBuckets {
			return fmt.Errorf("%w: buckets: %d buckets, at most %d (one broker producer each)", ErrInvalidPolicy, p.ring.Len(), MaxBuckets)
		}
	} else if p.Buckets != 0 || len(p.BucketStarts) > 0 {
		return fmt.Errorf("%w: buckets: only the buckets policy takes buckets", ErrInvalidPolicy)
	}
	if p.ManageKeyShared != nil && *p.ManageKeyShared && p.Kind != Buckets {
		return fmt.Errorf("%w: manage_key_shared: only the buckets policy has buckets to assign to Key_Shared consumers", ErrInvalidPolicy)
	}
	if p.MergeProducers && p.Kind != Coalesce {
		return fmt.Errorf("%w: merge_producers: only the coalesce policy merges producers", ErrInvalidPolicy)
	}
	if p.Compression != nil {
		if _, ok := pulsarpb.CompressionType_name[int32(*p.Compression)]; !ok {
			return fmt.Errorf("%w: compression %d unknown", ErrInvalidPolicy, *p.Compression)
		}
	}
	return nil
}

// restriction is the compiled form of Policy.Restricted: keys sorted, values as sets.
type restriction struct {
	keys    []string
	rawKeys [][]byte              // keys as bytes, for the entries' outer properties
	allowed []map[string]struct{} // nil set: any value
}

func compileRestriction(r map[string][]string) restriction {
	var c restriction
	for k := range r {
		c.keys = append(c.keys, k)
	}
	sort.Strings(c.keys)
	for _, k := range c.keys {
		c.rawKeys = append(c.rawKeys, []byte(k))
		var set map[string]struct{}
		if len(r[k]) > 0 {
			set = make(map[string]struct{}, len(r[k]))
			for _, v := range r[k] {
				set[v] = struct{}{}
			}
		}
		c.allowed = append(c.allowed, set)
	}
	return c
}

// index returns the position of key in the sorted key list, or -1.
func (c *restriction) index(key []byte) int {
	i := sort.Search(len(c.keys), func(i int) bool { return c.keys[i] >= string(key) })
	if i < len(c.keys) && c.keys[i] == string(key) {
		return i
	}
	return -1
}

func (c *restriction) admits(i int, value []byte) bool {
	if c.allowed[i] == nil {
		return true
	}
	_, ok := c.allowed[i][string(value)]
	return ok
}
