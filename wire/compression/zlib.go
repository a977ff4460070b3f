package compression

import (
	"bytes"
	"io"
	"sync"

	"github.com/klauspost/compress/zlib"
)

// Pulsar's ZLIB is java.util.zip.Deflater's default output: an RFC 1950
// stream with the 2-byte header and the Adler-32 trailer.

// appendWriter lets a zlib.Writer append straight into the caller's dst.
type appendWriter struct{ b []byte }

func (w *appendWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}

type zlibWriter struct {
	w   *zlib.Writer
	out appendWriter
}

var zlibWriters = sync.Pool{New: func() any {
	z := new(zlibWriter)
	z.w = zlib.NewWriter(&z.out)
	return z
}}

func compressZlib(dst, src []byte) ([]byte, error) {
	z := zlibWriters.Get().(*zlibWriter)
	defer zlibWriters.Put(z)
	z.out.b = dst
	z.w.Reset(&z.out)
	_, err := z.w.Write(src)
	if err == nil {
		err = z.w.Close()
	}
	out := z.out.b
	z.out.b = nil
	if err != nil {
		return dst, err
	}
	return out, nil
}

// syncFlushMarker ends a deflate stream flushed with Z_SYNC_FLUSH: an empty
// stored block.
var syncFlushMarker = []byte{0, 0, 0xff, 0xff}

type zlibReader struct {
	src bytes.Reader
	r   io.ReadCloser
}

var zlibReaders sync.Pool

func decompressZlib(region, src []byte) error {
	z, _ := zlibReaders.Get().(*zlibReader)
	if z == nil {
		z = new(zlibReader)
	}
	defer func() {
		z.src.Reset(nil) // do not keep the caller's payload alive in the pool
		zlibReaders.Put(z)
	}()
	z.src.Reset(src)
	if z.r == nil {
		r, err := zlib.NewReader(&z.src)
		if err != nil {
			return ErrCorrupt
		}
		z.r = r
	} else if err := z.r.(zlib.Resetter).Reset(&z.src, nil); err != nil {
		return ErrCorrupt
	}
	if _, err := io.ReadFull(z.r, region); err != nil {
		return ErrCorrupt
	}
	// One more read proves the stream holds no more than declared. A
	// complete stream then ends with io.EOF after its Adler-32 is checked.
	// The Java client's codec (Deflater with SYNC_FLUSH) never finishes the
	// stream: no final block, no trailer, so the input runs out instead
	// (io.ErrUnexpectedEOF). Java's Inflater and the Go client, which reads
	// exactly uncompressed_size bytes, both accept that, so we must too.
	// Only a stream that ends with the sync-flush marker may stop there;
	// any other early end is a truncation.
	var one [1]byte
	n, err := z.r.Read(one[:])
	switch {
	case n != 0:
		return ErrCorrupt
	case err == io.EOF:
		return nil
	case err == io.ErrUnexpectedEOF && bytes.HasSuffix(src, syncFlushMarker):
		return nil
	}
	return ErrCorrupt
}
