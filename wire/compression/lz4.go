package compression

import (
	"sync"

	"github.com/pierrec/lz4/v4"
)

// Pulsar's LZ4 is a bare block (no frame header, no checksum): the size
// comes from MessageMetadata.uncompressed_size.

var lz4Compressors = sync.Pool{New: func() any { return new(lz4.Compressor) }}

func compressLZ4(dst, src []byte) []byte {
	bound := lz4.CompressBlockBound(len(src))
	start := len(dst)
	dst = grow(dst, bound)
	c := lz4Compressors.Get().(*lz4.Compressor)
	n, err := c.CompressBlock(src, dst[start:])
	lz4Compressors.Put(c)
	if err == nil && n > 0 {
		return dst[:start+n]
	}
	// The library reports incompressible input as n == 0; emit a block
	// made of one literal run, which every LZ4 block decoder accepts.
	return appendLZ4Literals(dst[:start], src)
}

// appendLZ4Literals writes a block holding src as a single literal-only
// sequence: a token whose high nibble is the literal length (15 meaning
// "more length bytes follow"), the extra length bytes, then the literals.
func appendLZ4Literals(dst, src []byte) []byte {
	n := len(src)
	if n < 15 {
		dst = append(dst, byte(n<<4))
	} else {
		dst = append(dst, 0xF0)
		for n -= 15; n >= 255; n -= 255 {
			dst = append(dst, 255)
		}
		dst = append(dst, byte(n))
	}
	return append(dst, src...)
}

func decompressLZ4(region, src []byte) error {
	if len(region) == 0 {
		// The decoder needs a non-empty destination; an empty block is
		// a lone zero token.
		if len(src) == 1 && src[0] == 0 {
			return nil
		}
		return ErrCorrupt
	}
	n, err := lz4.UncompressBlock(src, region)
	if err != nil || n != len(region) {
		return ErrCorrupt
	}
	return nil
}
