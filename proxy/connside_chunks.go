package proxy

import (
	"math"
	"sync"
	"sync/atomic"
)

// The net.Conn transport's read buffers, in two sizes. A read borrows an array only once its
// socket is readable, so a connection waiting for input holds none (contract 7). A read that
// fills a small array (connReadChunk) says the socket held more: the connection is streaming,
// and its next read takes a large one (streamReadChunk), until a read the small one would have
// held. Streams then cost a quarter of the reads, each of which also parks and wakes the reader
// through the runtime's poller when it finds nothing: over TLS, 10 KB batched messages took
// 6-14 % less proxy CPU (e2e/proxy/bench, session 25), while request-response and other small
// traffic keeps 64 KiB per read in flight.
//
// What a large array may cost is bounded three ways:
//   - One read is what the session takes at once before backpressure can pause it (contract
//     5), so a connection reads into a large array only while the soft limit (Server.softLimit) is at
//     least largeReadsFrom: never under a small configured limit, nor while the memory budget
//     has lowered every limit.
//   - The budget does not count the arrays, only the bytes in them that the session has not
//     consumed; so a server lends at most an eighth of its memory budget in large arrays at
//     once (readArrays), and a read that would go over takes a small one.
//   - A large array is not kept for a remainder a small one holds (a frame's first bytes, while
//     the session waits for the rest, perhaps parked): connSide.handle moves it.
const (
	connReadChunk = 64 << 10
	// streamReadChunk is one byte short of 256 KiB: a slice that append grows past 32 KiB has a
	// capacity of whole pages, so a capacity of exactly this is always one of readArrays' large
	// arrays, which readArrays.put counts back in.
	streamReadChunk = 256<<10 - 1
)

// largeReadsFrom is the least soft limit (Server.softLimit) under which a streaming connection
// reads into a large array.
const largeReadsFrom = 1 << 20

var (
	readChunkPool   = sync.Pool{New: func() any { return new([connReadChunk]byte) }}
	streamChunkPool = sync.Pool{New: func() any { return new([streamReadChunk]byte) }}
)

// readArrays lends the read arrays of one server's net.Conn connections and counts the large
// ones out. Any goroutine may call its methods.
type readArrays struct {
	largeOut  atomic.Int64
	maxLarge  int64         // large arrays out at once, at most
	softLimit func() int    // the server's soft limit now (Server.softLimit); nil: no limit
	largeLent atomic.Uint64 // large arrays lent so far (specs)
}

// newReadArrays returns the lender of a server with memory budget budget (0: no budget, and no
// bound on large arrays) whose soft limit softLimit reports (nil: no limit).
func newReadArrays(budget int, softLimit func() int) *readArrays {
	a := &readArrays{maxLarge: math.MaxInt64, softLimit: softLimit}
	if budget > 0 {
		a.maxLarge = int64(budget) / 8 / streamReadChunk
	}
	return a
}

// unboundedArrays lends to connections outside a server (specs of rawConn alone).
var unboundedArrays = newReadArrays(0, nil)

// get borrows a whole array: a large one for a streaming connection while the soft limit allows
// it and the server has one to lend.
func (a *readArrays) get(streaming bool) []byte {
	if streaming && (a.softLimit == nil || a.softLimit() >= largeReadsFrom) {
		if n := a.largeOut.Add(1); n <= a.maxLarge {
			a.largeLent.Add(1)
			return streamChunkPool.Get().(*[streamReadChunk]byte)[:]
		}
		a.largeOut.Add(-1)
	}
	return readChunkPool.Get().(*[connReadChunk]byte)[:]
}

// put returns the array b begins to its pool; a buffer of another capacity (input grown past one
// read) is left to the collector. Call it once nothing refers to b.
func (a *readArrays) put(b []byte) {
	switch cap(b) {
	case connReadChunk:
		readChunkPool.Put((*[connReadChunk]byte)(b[:connReadChunk]))
	case streamReadChunk:
		a.largeOut.Add(-1)
		streamChunkPool.Put((*[streamReadChunk]byte)(b[:streamReadChunk]))
	}
}

// streamingAfter reports whether a connection whose last read returned n bytes is streaming:
// the small array would have been filled.
func streamingAfter(n int) bool { return n >= connReadChunk }
