package proxy

import (
	"bytes"
	"crypto/sha256"
	"io"
	"testing"
	"time"
)

// Given a connection whose peer sends 4 MiB as fast as it can,
// when it is read with a session whose soft limit allows large reads, and again with one whose
// limit does not,
// then both read every byte in order; the first reads into large arrays once the stream showed
// (a read that filled a small one), the second only ever into small ones; none is left out.
func TestStreamingReadsTakeLargeArraysOnlyUnderALargeSoftLimit(t *testing.T) {
	payload := bytes.Repeat([]byte("0123456789abcdef"), 4<<20/16)
	for _, tc := range []struct {
		name      string
		allowed   bool
		wantLarge bool
	}{
		{"soft limit of at least largeReadsFrom", true, true},
		{"a smaller soft limit", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			near, far := loopbackPair(t)
			defer near.Close()
			defer far.Close()
			r := newRawConn(near)
			limit := largeReadsFrom - 1
			if tc.allowed {
				limit = largeReadsFrom
			}
			r.arrays = newReadArrays(0, func() int { return limit })
			go func() { _, _ = far.Write(payload); far.Close() }()

			h := sha256.New()
			caps := map[int]int{}
			total := 0
			for total < len(payload) {
				b, err := r.readChunk()
				if err != nil {
					t.Fatalf("after %d bytes: %v", total, err)
				}
				h.Write(b)
				total += len(b)
				caps[cap(b)]++
				r.arrays.put(b)
			}

			if got, want := h.Sum(nil), sha256.Sum256(payload); !bytes.Equal(got, want[:]) {
				t.Fatal("the bytes read differ from those sent")
			}
			if got := caps[streamReadChunk] > 0; got != tc.wantLarge {
				t.Errorf("reads by array size %v: large arrays used %v, want %v", caps, got, tc.wantLarge)
			}
			if len(caps) > 2 || caps[connReadChunk] == 0 {
				t.Errorf("reads by array size %v: want the small size first, and no other", caps)
			}
			if n := r.arrays.largeOut.Load(); n != 0 {
				t.Errorf("%d large arrays still out", n)
			}
		})
	}
}

// Given a server whose memory budget allows two large read arrays at once,
// when three are asked for, one comes back, and a buffer grown by append to 256 KiB is returned,
// then the third ask gets a small array, the next after the return a large one, and the grown
// buffer is not counted as a large array coming back.
func TestReadArraysLendAtMostAnEighthOfTheBudgetInLargeArrays(t *testing.T) {
	a := newReadArrays(2*8*streamReadChunk, nil)
	first, second := a.get(true), a.get(true)

	third := a.get(true)
	a.put(first)
	fourth := a.get(true)
	a.put(make([]byte, 0, 256<<10))

	if cap(first) != streamReadChunk || cap(second) != streamReadChunk {
		t.Fatalf("the first two: capacities %d and %d", cap(first), cap(second))
	}
	if cap(third) != connReadChunk {
		t.Errorf("the third, over the bound: capacity %d, want %d", cap(third), connReadChunk)
	}
	if cap(fourth) != streamReadChunk {
		t.Errorf("after one came back: capacity %d, want %d", cap(fourth), streamReadChunk)
	}
	if n := a.largeOut.Load(); n != 2 {
		t.Errorf("%d large arrays counted out, want 2", n)
	}
	if n := newReadArrays(0, nil).maxLarge; n < 1<<40 {
		t.Errorf("without a budget at most %d large arrays; want no bound", n)
	}
}

// Given a proxy with a TLS listener in front of a (fake) broker, with the default soft limit, and
// with a memory budget too small to lend a large read array,
// when a TLS client streams 16 MiB of SENDs and the broker 16 MiB of MESSAGEs back,
// then both arrive byte for byte; with the default settings the connections read into large
// arrays, with the small budget never; and once the connection is closed no large array is out.
func TestTLSStreamsThroughLargeReadArraysIntact(t *testing.T) {
	for _, tc := range []struct {
		name      string
		budget    int
		wantLarge bool
	}{
		{"default settings", 0, true},
		{"a budget under eight large arrays", 8*streamReadChunk - 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fb := newFakeBroker(t)
			srv, files, _ := startTLSProxy(t, fb, func(c *Config) { c.MemoryBudget = tc.budget })
			c, broker := tlsHandshake(t, srv, files, fb)
			up, down := sendFrames(512, 32<<10), messageFrames(t, 512, 32<<10)

			errs := make(chan error, 2)
			go func() { _, err := c.Write(up); errs <- err }()
			go func() { _, err := broker.Write(down); errs <- err }()
			gotUp, gotDown := make([]byte, len(up)), make([]byte, len(down))
			_ = broker.SetReadDeadline(time.Now().Add(30 * time.Second))
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			readUp := make(chan error, 1)
			go func() { _, err := io.ReadFull(broker, gotUp); readUp <- err }()
			_, errDown := io.ReadFull(c, gotDown)

			if err := <-readUp; err != nil || errDown != nil {
				t.Fatalf("reading: broker side %v, client side %v", err, errDown)
			}
			for range 2 {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			if !bytes.Equal(gotUp, up) || !bytes.Equal(gotDown, down) {
				t.Fatal("bytes differ from those sent")
			}
			if lent := srv.readArrays.largeLent.Load(); (lent > 0) != tc.wantLarge {
				t.Errorf("%d large arrays lent; want some: %v", lent, tc.wantLarge)
			}
			c.Close()
			for deadline := time.Now().Add(5 * time.Second); srv.readArrays.largeOut.Load() != 0; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("%d large arrays still out 5 s after the client closed", srv.readArrays.largeOut.Load())
				}
			}
		})
	}
}
