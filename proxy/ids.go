package proxy

// The ids the proxy itself puts on a broker connection (request ids of its
// own PRODUCER, CLOSE_PRODUCER and CLOSE_CONSUMER commands, producer ids of
// bucket lanes) come from one allocator per session, so no two of them
// collide and none collides with the client's: clients count their ids up
// from 0, the proxy's start at ownIDBase. A broker answer carrying an id at
// or above ownIDBase answers the proxy, never the client.

// ownIDBase is where the ids the proxy allocates start.
const ownIDBase = 1 << 62

// idAllocator hands out a session's own ids. Loop-owned.
type idAllocator struct{ last uint64 }

// next returns a fresh id, at or above ownIDBase.
func (a *idAllocator) next() uint64 {
	a.last++
	return ownIDBase + a.last
}

// isOwnID reports whether id was allocated by the proxy rather than the client.
func isOwnID(id uint64) bool { return id >= ownIDBase }
