// Package compression implements the payload codecs of the Pulsar protocol
// in both directions: NONE, LZ4 (raw block), ZLIB (RFC 1950 stream), ZSTD
// (standard frame) and SNAPPY (raw block), byte-compatible with the Go and
// Java clients.
//
// Contract:
//   - Decompress never allocates more than the declared uncompressed size,
//     and refuses a declared size above the caller's maximum before touching
//     the input, so a 10-byte payload claiming 4 GiB fails with ErrTooLarge
//     at no cost. The output must decode to exactly the declared size,
//     otherwise ErrCorrupt.
//   - Compress and Decompress append to dst and allocate only when dst lacks
//     capacity (plus codec-internal state, pooled).
//   - All functions are safe for concurrent use.
package compression

import (
	"errors"

	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// DefaultMaxUncompressedSize is a suggested bound for Decompress. A single
// message can legitimately be larger uncompressed than the broker's 5 MiB
// frame limit, so the bound is set well above it.
const DefaultMaxUncompressedSize = 64 << 20

// ErrTooLarge means the declared uncompressed size is negative or above the
// caller's maximum, or the compressed data's own size header exceeds it.
var ErrTooLarge = errors.New("compression: uncompressed size over limit")

// ErrCorrupt means the compressed data is invalid or does not decode to
// exactly the declared uncompressed size.
var ErrCorrupt = errors.New("compression: corrupt data")

// ErrUnknownCodec means the CompressionType is not one this package knows.
var ErrUnknownCodec = errors.New("compression: unknown codec")

// Compress appends src compressed with codec c to dst. The caller records
// len(src) as MessageMetadata.uncompressed_size.
func Compress(dst []byte, c pulsarpb.CompressionType, src []byte) ([]byte, error) {
	switch c {
	case pulsarpb.CompressionType_NONE:
		return append(dst, src...), nil
	case pulsarpb.CompressionType_LZ4:
		return compressLZ4(dst, src), nil
	case pulsarpb.CompressionType_ZLIB:
		return compressZlib(dst, src)
	case pulsarpb.CompressionType_ZSTD:
		return compressZstd(dst, src), nil
	case pulsarpb.CompressionType_SNAPPY:
		return compressSnappy(dst, src), nil
	}
	return dst, ErrUnknownCodec
}

// Decompress appends the decompression of src to dst. uncompressedSize is
// MessageMetadata.uncompressed_size and must lie in [0, maxSize]; maxSize
// <= 0 means DefaultMaxUncompressedSize. Exactly uncompressedSize bytes are
// appended on success. On error dst is returned with its original length.
//
// For NONE, src is copied; callers that can use the payload in place should
// not call Decompress for it.
func Decompress(dst []byte, c pulsarpb.CompressionType, src []byte, uncompressedSize, maxSize int) ([]byte, error) {
	if maxSize <= 0 {
		maxSize = DefaultMaxUncompressedSize
	}
	if uncompressedSize < 0 || uncompressedSize > maxSize {
		return dst, ErrTooLarge
	}
	var err error
	out := grow(dst, uncompressedSize)
	region := out[len(dst) : len(dst)+uncompressedSize]
	switch c {
	case pulsarpb.CompressionType_NONE:
		if len(src) != uncompressedSize {
			return dst, ErrCorrupt
		}
		copy(region, src)
	case pulsarpb.CompressionType_LZ4:
		err = decompressLZ4(region, src)
	case pulsarpb.CompressionType_ZLIB:
		err = decompressZlib(region, src)
	case pulsarpb.CompressionType_ZSTD:
		err = decompressZstd(region, src)
	case pulsarpb.CompressionType_SNAPPY:
		err = decompressSnappy(region, src)
	default:
		return dst, ErrUnknownCodec
	}
	if err != nil {
		return dst, err
	}
	return out[:len(dst)+uncompressedSize], nil
}

// grow returns dst with room for n more bytes, allocating exactly what is
// missing so the bound on memory is the declared size.
func grow(dst []byte, n int) []byte {
	if cap(dst)-len(dst) >= n {
		return dst[:len(dst)+n]
	}
	out := make([]byte, len(dst)+n)
	copy(out, dst)
	return out
}
