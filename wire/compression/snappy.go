package compression

import "github.com/klauspost/compress/snappy"

// Pulsar's SNAPPY is the raw block format (a varint length then elements),
// not the framed stream format.

func compressSnappy(dst, src []byte) []byte {
	start := len(dst)
	dst = grow(dst, snappy.MaxEncodedLen(len(src)))
	out := snappy.Encode(dst[start:], src)
	return dst[:start+len(out)]
}

func decompressSnappy(region, src []byte) error {
	// The block starts with its decoded length: check it before the
	// decoder can allocate for it.
	n, err := snappy.DecodedLen(src)
	if err != nil || n != len(region) {
		return ErrCorrupt
	}
	out, err := snappy.Decode(region, src)
	if err != nil || len(out) != len(region) {
		return ErrCorrupt
	}
	if len(out) > 0 && &out[0] != &region[0] {
		copy(region, out)
	}
	return nil
}
