package compression

import (
	"sync"

	"github.com/klauspost/compress/zstd"
)

// Pulsar's ZSTD is one standard frame (magic 28 B5 2F FD) per payload.

// maxZstdWindow bounds the history a frame may ask the decoder for. The
// Java client (level 3) and the Go client use windows of a few MiB.
const maxZstdWindow = 64 << 20

var (
	zstdOnce    sync.Once
	zstdEncoder *zstd.Encoder
	zstdDecoder *zstd.Decoder
)

func zstdInit() {
	var err error
	// EncodeAll and DecodeAll are safe for concurrent use on one value.
	zstdEncoder, err = zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1))
	if err != nil {
		panic("compression: zstd encoder: " + err.Error())
	}
	zstdDecoder, err = zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(0),
		zstd.WithDecoderMaxWindow(maxZstdWindow),
		// Never let DecodeAll grow the output past the capacity we
		// give it: that capacity is the declared uncompressed size.
		zstd.WithDecodeAllCapLimit(true),
	)
	if err != nil {
		panic("compression: zstd decoder: " + err.Error())
	}
}

func compressZstd(dst, src []byte) []byte {
	zstdOnce.Do(zstdInit)
	return zstdEncoder.EncodeAll(src, dst)
}

func decompressZstd(region, src []byte) error {
	zstdOnce.Do(zstdInit)
	// Check the frame's own content size, when it declares one, before
	// decoding anything.
	var h zstd.Header
	if err := h.Decode(src); err != nil {
		return ErrCorrupt
	}
	if h.HasFCS && h.FrameContentSize != uint64(len(region)) {
		return ErrCorrupt
	}
	out, err := zstdDecoder.DecodeAll(src, region[:0:len(region)])
	if err != nil || len(out) != len(region) {
		return ErrCorrupt
	}
	if len(out) > 0 && &out[0] != &region[0] {
		// DecodeAll honoured the cap limit but returned another buffer;
		// keep the contract that the result lives in dst.
		copy(region, out)
	}
	return nil
}
