package route

// Slot constants of the 4.x broker (StickyKeyConsumerSelector).
const (
	// FullRange is DEFAULT_RANGE_SIZE (2 << 15): STICKY hash ranges live in
	// [0, FullRange-1].
	FullRange = 65536
	// slotNotSet is STICKY_KEY_HASH_NOT_SET; the broker never produces it.
	slotNotSet = 0
)

// StickySlot is the slot a Key_Shared STICKY subscription
// (HashRangeExclusiveStickyKeyConsumerSelector) gives a key on Pulsar 4.x:
// (murmur3(key) & 0x7FFFFFFF) % 65536, with 0 replaced by 1. It equals
// HashB(key) except that hashB 0 becomes slot 1. Any goroutine may call it.
func StickySlot(key []byte) int {
	return StickySlotOfHash(Murmur3x86_32(key, 0))
}

// StickySlotOfHash is StickySlot for an already computed raw murmur3 value.
// Any goroutine may call it.
func StickySlotOfHash(h uint32) int {
	s := int(h&0x7FFFFFFF) % FullRange
	if s == slotNotSet {
		s = slotNotSet + 1
	}
	return s
}

// ConsistentHashingSlot is the slot of the default AUTO_SPLIT selector on
// Pulsar 4.x (ConsistentHashingStickyKeyConsumerSelector, key hash range
// [1, 65535]): (murmur3(key) & 0x7FFFFFFF) % 65535 + 1. It is not hashB, which
// is why bucket alignment needs STICKY consumers. Any goroutine may call it.
func ConsistentHashingSlot(key []byte) int {
	return ConsistentHashingSlotOfHash(Murmur3x86_32(key, 0))
}

// ConsistentHashingSlotOfHash is ConsistentHashingSlot for a raw murmur3 value.
// Any goroutine may call it.
func ConsistentHashingSlotOfHash(h uint32) int {
	// The range starts at 1, so the 0 -> 1 fix-up of makeStickyKeyHash never fires.
	return int(h&0x7FFFFFFF)%(FullRange-1) + 1
}
