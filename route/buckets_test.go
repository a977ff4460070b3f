package route

import (
	"fmt"
	"strings"
	"testing"
)

// bucketByScan is the obvious reference: the last start <= h.
func bucketByScan(starts []int, h uint16) int {
	i := 0
	for j, s := range starts {
		if s <= int(h) {
			i = j
		}
	}
	return i
}

func checkEveryHash(t *testing.T, b *Buckets) {
	t.Helper()
	starts := b.Starts()
	for h := range FullRange {
		if got, want := b.Bucket(uint16(h)), bucketByScan(starts, uint16(h)); got != want {
			t.Fatalf("Bucket(%d) = %d, want %d (starts %v...)", h, got, want, starts[:min(len(starts), 8)])
		}
	}
	// Ranges tile the ring: contiguous, no gap, no overlap; bucket 0 holds slot 1.
	next := 0
	for i := range b.Len() {
		lo, hi := b.Range(i)
		if int(lo) != next || hi < lo || (i == 0 && hi < 1) {
			t.Fatalf("Range(%d) = [%d, %d], want start %d, bucket 0 at least 2 wide", i, lo, hi, next)
		}
		next = int(hi) + 1
	}
	if next != FullRange {
		t.Fatalf("ranges end at %d, want %d", next-1, FullRange-1)
	}
}

func TestEqualBuckets(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 7, 10, 1000, 4097, MaxBuckets} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			b, err := NewEqualBuckets(n)
			if err != nil {
				t.Fatal(err)
			}
			checkEveryHash(t, b)
			minW, maxW := FullRange, 0
			for i := range n {
				lo, hi := b.Range(i)
				w := int(hi) - int(lo) + 1
				minW, maxW = min(minW, w), max(maxW, w)
			}
			if maxW-minW > 1 || minW != FullRange/n {
				t.Errorf("widths in [%d, %d], want floor(65536/%d)=%d and at most one more", minW, maxW, n, FullRange/n)
			}
		})
	}
}

func TestEqualBucketsBoundariesForThree(t *testing.T) {
	// Given three buckets, which do not divide 65536
	b, _ := NewEqualBuckets(3)
	// When their starts are read
	got := b.Starts()
	// Then they are floor(i*65536/3)
	if want := []int{0, 21845, 43690}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("starts = %v, want %v", got, want)
	}
}

func TestEqualBucketsRejectsBadCount(t *testing.T) {
	for _, n := range []int{-1, 0, MaxBuckets + 1} {
		if _, err := NewEqualBuckets(n); err == nil {
			t.Errorf("NewEqualBuckets(%d) accepted", n)
		}
	}
}

func TestExplicitBuckets(t *testing.T) {
	for _, starts := range [][]int{
		{0},
		{0, 2},
		{0, 100, 101, 60000, 65535},
		{0, 16384, 32768, 49152},
		{0, 3, 9, 27, 81, 243, 729, 2187, 6561, 19683, 59049},
	} {
		t.Run(fmt.Sprint(starts), func(t *testing.T) {
			b, err := NewBuckets(starts)
			if err != nil {
				t.Fatal(err)
			}
			checkEveryHash(t, b)
		})
	}
}

func TestExplicitBucketsValidation(t *testing.T) {
	tests := []struct {
		starts []int
		want   string
	}{
		{nil, "empty"},
		{[]int{1, 100}, "boundaries[0] = 1, must be 0"},
		{[]int{0, 100, 50}, "boundaries[2] = 50, must be greater than boundaries[1]"},
		{[]int{0, 100, 100}, "boundaries[2] = 100, must be greater"},
		{[]int{0, 65536}, "boundaries[1] = 65536, outside"},
		{[]int{0, -5}, "boundaries[1] = -5, outside"},
		{[]int{0, 1, 10}, "boundaries[1] = 1, must be at least 2"},
		{make([]int, MaxBuckets+1), "at most"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			_, err := NewBuckets(tt.starts)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("NewBuckets(%v) error = %v, want it to mention %q", tt.starts, err, tt.want)
			}
		})
	}
}

// The property the buckets policy sells: a STICKY consumer given Range(i)
// receives exactly the keys whose hashB falls in bucket i.
func TestStickyConsumerWithBucketRangeGetsBucketKeys(t *testing.T) {
	equal, _ := NewEqualBuckets(4)
	explicit, _ := NewBuckets([]int{0, 2, 3, 40000})
	zero := keyWithHashB(t, 0)
	for _, b := range []*Buckets{equal, explicit} {
		keys := [][]byte{zero}
		for i := range 20000 {
			keys = append(keys, fmt.Appendf(nil, "key-%d", i))
		}
		for _, k := range keys {
			bucket := b.Bucket(HashB(k))
			slot := StickySlot(k)
			lo, hi := b.Range(bucket)
			if slot < int(lo) || slot > int(hi) {
				t.Fatalf("key %q: hashB %d in bucket %d [%d, %d] but STICKY slot %d is outside", k, HashB(k), bucket, lo, hi, slot)
			}
		}
	}
}

var sinkInt int

func BenchmarkBucket(b *testing.B) {
	equal, _ := NewEqualBuckets(4)
	equalOdd, _ := NewEqualBuckets(1000)
	starts := make([]int, 1024)
	for i := range starts {
		starts[i] = i * 64
	}
	explicit4, _ := NewBuckets([]int{0, 1000, 30000, 50000})
	explicit1024, _ := NewBuckets(starts)
	for _, c := range []struct {
		name string
		b    *Buckets
	}{{"equal4", equal}, {"equal1000", equalOdd}, {"explicit4", explicit4}, {"explicit1024", explicit1024}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			h := uint16(12345)
			for b.Loop() {
				sinkInt = c.b.Bucket(h)
				h += 40503 // odd stride visits the whole ring
			}
		})
	}
}
