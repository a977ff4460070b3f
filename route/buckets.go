package route

import "fmt"

// MaxBuckets bounds N so that equal buckets are at least 2 hashes wide: bucket
// 0 must contain hash 1, because the STICKY selector maps hashB 0 to slot 1.
const MaxBuckets = FullRange / 2

// Buckets divides the 16-bit hashB ring into N contiguous buckets. It is
// immutable after construction, so any goroutine may use it concurrently.
type Buckets struct {
	// starts[i] is the first hash of bucket i; starts[N] = 65536 is a sentinel.
	starts []uint32
	// equal selects the arithmetic lookup; explicit boundaries use a search.
	equal bool
	// coarse[hi] is the bucket of hash hi<<8 (coarse[256] = N-1): a lookup
	// searches only the buckets starting inside h's 256-hash block, so
	// explicit boundaries cost a few compares on 514 bytes of cache.
	coarse [257]uint16
}

// NewEqualBuckets returns n buckets of (almost) equal width. Bucket i starts
// at floor(i*65536/n); so when n does not divide 65536 the widths are
// floor(65536/n) or that plus one, the wider ones spread evenly rather than
// piled at one end. n must be in [1, MaxBuckets].
// Any goroutine may call it.
func NewEqualBuckets(n int) (*Buckets, error) {
	if n < 1 || n > MaxBuckets {
		return nil, fmt.Errorf("route: bucket count %d out of range [1, %d]", n, MaxBuckets)
	}
	b := &Buckets{starts: make([]uint32, n+1), equal: true}
	for i := range n + 1 {
		b.starts[i] = uint32(uint64(i) * FullRange / uint64(n))
	}
	return b, nil
}

// NewBuckets returns buckets with explicit start hashes: bucket i covers
// [starts[i], starts[i+1]-1] and the last one ends at 65535. starts must begin
// with 0, increase strictly, stay within [0, 65535], and starts[1] must be at
// least 2 (see MaxBuckets). Errors name the offending index.
// Any goroutine may call it.
func NewBuckets(starts []int) (*Buckets, error) {
	if len(starts) == 0 {
		return nil, fmt.Errorf("route: bucket boundaries: empty list")
	}
	if len(starts) > MaxBuckets {
		return nil, fmt.Errorf("route: bucket boundaries: %d buckets, at most %d", len(starts), MaxBuckets)
	}
	if starts[0] != 0 {
		return nil, fmt.Errorf("route: bucket boundaries[0] = %d, must be 0", starts[0])
	}
	b := &Buckets{starts: make([]uint32, len(starts)+1)}
	for i, s := range starts {
		switch {
		case s < 0 || s >= FullRange:
			return nil, fmt.Errorf("route: bucket boundaries[%d] = %d, outside [0, %d]", i, s, FullRange-1)
		case i > 0 && s <= starts[i-1]:
			return nil, fmt.Errorf("route: bucket boundaries[%d] = %d, must be greater than boundaries[%d] = %d", i, s, i-1, starts[i-1])
		case i == 1 && s < 2:
			return nil, fmt.Errorf("route: bucket boundaries[1] = %d, must be at least 2: bucket 0 must hold slot 1, where the broker puts hashB 0", s)
		}
		b.starts[i] = uint32(s)
	}
	b.starts[len(starts)] = FullRange
	for hi := range 256 {
		b.coarse[hi] = uint16(b.search(0, len(starts), uint32(hi)<<8))
	}
	b.coarse[256] = uint16(len(starts) - 1)
	return b, nil
}

// Len returns the number of buckets. Any goroutine may call it.
func (b *Buckets) Len() int { return len(b.starts) - 1 }

// Bucket returns the index of the bucket holding hash h. It does not allocate.
// Any goroutine may call it.
func (b *Buckets) Bucket(h uint16) int {
	if b.equal {
		// The largest i with floor(i*65536/n) <= h is floor(((h+1)*n-1)/65536).
		n := uint32(len(b.starts) - 1)
		return int(((uint32(h)+1)*n - 1) >> 16)
	}
	blk := h >> 8
	return b.search(int(b.coarse[blk]), int(b.coarse[blk+1])+1, uint32(h))
}

// search returns the last i in [lo, hi) with starts[i] <= h, given
// starts[lo] <= h < starts[hi].
func (b *Buckets) search(lo, hi int, h uint32) int {
	for hi-lo > 1 {
		mid := int(uint(lo+hi) >> 1)
		if b.starts[mid] <= h {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// Range returns bucket i's inclusive hash range [min, max]. It panics if i is
// not in [0, Len()). Any goroutine may call it.
//
// To make a Key_Shared STICKY consumer receive exactly bucket i, give it the
// hash range [min, max] as returned (KeySharedMeta.hashRanges is inclusive).
// For bucket 0 this range includes 0, a slot the broker never produces: keys
// whose hashB is 0 arrive at slot 1, which bucket 0 also holds because it is
// at least two hashes wide. Ranges of different buckets never
// overlap, so the broker accepts one consumer per bucket.
func (b *Buckets) Range(i int) (min, max uint16) {
	return uint16(b.starts[i]), uint16(b.starts[i+1] - 1)
}

// Starts returns a copy of the bucket start hashes, one per bucket.
// Any goroutine may call it.
func (b *Buckets) Starts() []int {
	out := make([]int, b.Len())
	for i := range out {
		out[i] = int(b.starts[i])
	}
	return out
}
