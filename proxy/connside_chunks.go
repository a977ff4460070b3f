package proxy

import "sync"

// The net.Conn transport's read buffers, in two sizes. A read borrows an array only once its
// socket is readable, so a connection waiting for input holds none (contract 7). A read that
// fills a small array (connReadChunk) says the socket held more: the connection is streaming,
// and its next read takes a large one (streamReadChunk), until a read the small one would have
// held. Streams then cost a quarter of the reads, each of which also parks and wakes the reader
// through the runtime's poller when it finds nothing: over TLS, 10 KB batched messages took
// 11-17 % less proxy CPU (e2e/proxy/bench, session 25), while request-response and other small
// traffic keeps 64 KiB per read in flight. One read is what the session takes at once before
// backpressure can pause it (contract 5), so the large array is used only while the session's
// soft limit is at least largeReadsFrom: never under a small configured limit, nor while the
// memory budget has lowered every limit.
const (
	connReadChunk   = 64 << 10
	streamReadChunk = 256 << 10
)

var (
	readChunkPool   = sync.Pool{New: func() any { return new([connReadChunk]byte) }}
	streamChunkPool = sync.Pool{New: func() any { return new([streamReadChunk]byte) }}
)

// getReadChunk borrows a whole array: a large one for a streaming connection. Any goroutine
// may call it.
func getReadChunk(streaming bool) []byte {
	if streaming {
		return streamChunkPool.Get().(*[streamReadChunk]byte)[:]
	}
	return readChunkPool.Get().(*[connReadChunk]byte)[:]
}

// putReadChunk returns the array b begins to its pool; a buffer of another capacity (input grown
// past one read) is left to the collector. Any goroutine may call it, once nothing refers to b.
func putReadChunk(b []byte) {
	switch cap(b) {
	case connReadChunk:
		readChunkPool.Put((*[connReadChunk]byte)(b[:connReadChunk]))
	case streamReadChunk:
		streamChunkPool.Put((*[streamReadChunk]byte)(b[:streamReadChunk]))
	}
}

// largeReadsFrom is the least soft limit (session.softLimit) under which a streaming connection
// reads into a large array.
const largeReadsFrom = 4 * streamReadChunk

// streamingAfter reports whether a connection whose last read returned n bytes is streaming:
// the small array would have been filled.
func streamingAfter(n int) bool { return n >= connReadChunk }
