package proxy

import (
	"testing"
	"time"
)

// Given a connection's reads (or writes), each a pause since the one before and a size,
// when they are counted one by one,
// then the traffic is sparse (raw system calls) only once two in a row were small and came after
// a pause: a stream (short pauses) or a backlog found after a pause (a large read) is not, and
// one such read ends a sparse run.
func TestTrafficIsSparseOnlyAfterSmallMovesAfterPauses(t *testing.T) {
	type move struct {
		gap  time.Duration
		n    int
		want bool // sparse after this move
	}
	long, short := 2*quickGap, quickGap/5
	for _, tc := range []struct {
		name  string
		moves []move
	}{
		{"request-response", []move{{long, 150, false}, {long, 150, true}, {long, 150, true}}},
		{"a stream", []move{{short, 150, false}, {short, 150, false}, {short, 150, false}}},
		{"a backlog after a pause", []move{{long, 150, false}, {long, 64 << 10, false}, {long, 150, false}}},
		{"a stream ends a sparse run", []move{{long, 150, false}, {long, 150, true}, {short, 150, false}, {long, 150, false}, {long, 150, true}}},
		{"exactly the thresholds", []move{{quickGap, sparseMax, false}, {quickGap, sparseMax, true}, {quickGap - 1, 1, false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var run uint8
			for i, m := range tc.moves {

				run = nextGaps(run, int64(m.gap), m.n)

				if got := run >= sparseAfter; got != m.want {
					t.Fatalf("move %d (%v after the last, %d bytes): sparse %v, want %v", i, m.gap, m.n, got, m.want)
				}
			}
		})
	}
}
