package proxy

import (
	"bytes"
	"io"
	"net"
	"testing"
)

// Given an outbound queue,
// when writes of sizes around the chunk size are appended and the queue is taken and written
// to a plain TCP connection and to a non-TCP one,
// then the peer reads exactly the bytes written, in order, and the count is the sum.
func TestOutQueueKeepsOrderAcrossChunks(t *testing.T) {
	var want []byte
	var q outQueue
	for i, n := range []int{1, outChunkSize - 1, 2, outChunkSize, 3 * outChunkSize / 2, 7} {
		b := bytes.Repeat([]byte{byte('a' + i)}, n)
		want = append(want, b...)
		q.append(b)
	}
	if q.n != len(want) {
		t.Fatalf("queued %d, want %d", q.n, len(want))
	}
	for _, name := range []string{"tcp", "pipe"} {
		t.Run(name, func(t *testing.T) {
			var q2 outQueue
			q2.append(want)
			w, r := connPair(t, name)
			got := make(chan []byte)
			go func() { b, _ := io.ReadAll(r); got <- b }()

			chunks := q2.take(nil)
			n, _, err := writeChunks(w, chunks, nil)
			releaseChunks(chunks)
			w.Close()

			if err != nil || n != int64(len(want)) {
				t.Fatalf("wrote %d, %v", n, err)
			}
			if b := <-got; !bytes.Equal(b, want) {
				t.Fatalf("read %d bytes, not the %d written in order", len(b), len(want))
			}
			if q2.n != 0 || len(q2.chunks) != 0 {
				t.Fatalf("queue not empty after take: %d", q2.n)
			}
		})
	}
	q.drop()
}

// connPair returns a writer and a reader connected by TCP on loopback or by net.Pipe.
func connPair(t *testing.T, kind string) (net.Conn, net.Conn) {
	if kind == "pipe" {
		a, b := net.Pipe()
		return a, b
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	w, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close(); r.Close() })
	return w, r
}

// Given a queue that has run in steady state,
// when a write of a few KiB is appended and taken again,
// then nothing is allocated (chunks come back from the pool).
func TestOutQueueSteadyStateDoesNotAllocate(t *testing.T) {
	var q outQueue
	var chunks [][]byte
	b := make([]byte, 10<<10)
	round := func() {
		q.append(b)
		chunks = q.take(chunks)
		releaseChunks(chunks)
	}
	round()
	if a := testing.AllocsPerRun(100, round); a > 0 {
		t.Errorf("%v allocations per append and take", a)
	}
}
