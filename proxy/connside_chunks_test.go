package proxy

import (
	"bytes"
	"crypto/sha256"
	"testing"
)

// Given a connection whose peer sends 4 MiB as fast as it can,
// when it is read with a session whose soft limit allows large reads, and again with one whose
// limit does not,
// then both read every byte in order; the first reads into large arrays once the stream showed
// (a read that filled a small one), the second only ever into small ones.
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
			r.largeReads = func() bool { return tc.allowed }
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
				putReadChunk(b)
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
		})
	}
}
