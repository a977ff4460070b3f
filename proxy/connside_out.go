package proxy

import (
	"net"
	"sync"
)

// outQueue is a connSide's spill (connside_raw.go): the outbound bytes its
// socket did not take, in fixed-size chunks from a pool, filled in order.
// They are copied once, into the chunks; the writer goroutine takes the
// whole queue and writes it chunk by chunk.
// A single growing slice would do the same with fewer lines, but appending
// to one re-copies everything queued each time it grows (at 1.25x for large
// slices: four times the queue's high-water mark per connection, 11 % of the
// proxy's CPU on 10 KB batches over TLS), and it keeps that high-water mark
// allocated for the connection's life.
type outQueue struct {
	chunks [][]byte // each from outChunkPool, len = bytes queued in it
	n      int      // bytes queued
}

// outChunkSize is the size of one chunk: four full TLS records.
const outChunkSize = 64 << 10

// outChunkPool holds *[outChunkSize]byte: an array pointer goes in and out
// of the pool without an allocation, a slice header would not.
var outChunkPool = sync.Pool{New: func() any { return new([outChunkSize]byte) }}

// append copies b to the end of the queue.
func (q *outQueue) append(b []byte) {
	q.n += len(b)
	for len(b) > 0 {
		if len(q.chunks) == 0 || len(q.chunks[len(q.chunks)-1]) == outChunkSize {
			q.chunks = append(q.chunks, outChunkPool.Get().(*[outChunkSize]byte)[:0])
		}
		last := &q.chunks[len(q.chunks)-1]
		m := min(len(b), outChunkSize-len(*last))
		*last = append(*last, b[:m]...)
		b = b[m:]
	}
}

// take moves the queue's chunks to dst (emptied first) and empties the queue.
func (q *outQueue) take(dst [][]byte) [][]byte {
	dst = append(dst[:0], q.chunks...)
	clear(q.chunks)
	q.chunks, q.n = q.chunks[:0], 0
	return dst
}

// drop empties the queue, returning its chunks to the pool.
func (q *outQueue) drop() {
	releaseChunks(q.chunks)
	q.chunks, q.n = q.chunks[:0], 0
}

// releaseChunks returns chunks to the pool and clears the slice's entries.
func releaseChunks(chunks [][]byte) {
	for i, c := range chunks {
		if cap(c) == outChunkSize {
			outChunkPool.Put((*[outChunkSize]byte)(c[:outChunkSize]))
		}
		chunks[i] = nil
	}
}

// writeChunks writes chunks to c in order: one writev for a plain TCP
// connection (through scratch, which net.Buffers consumes, so chunks stay
// whole for releaseChunks), one Write per chunk otherwise (crypto/tls seals
// each into records). It returns the bytes written and scratch for reuse.
func writeChunks(c net.Conn, chunks [][]byte, scratch net.Buffers) (int64, net.Buffers, error) {
	if _, ok := c.(*net.TCPConn); ok {
		scratch = append(scratch[:0], chunks...)
		bufs := scratch
		n, err := bufs.WriteTo(c)
		clear(scratch)
		return n, scratch, err
	}
	var n int64
	for _, b := range chunks {
		m, err := c.Write(b)
		n += int64(m)
		if err != nil {
			return n, scratch, err
		}
	}
	return n, scratch, nil
}
