package proxy

import (
	"crypto/tls"
	"net"
	"sync"
)

// recordBatcher is the socket under a tls.Conn of the net.Conn transport.
// crypto/tls writes every record (at most 16 KiB of plaintext) with a write
// of its own, so a connSide writer handing it a 64 KiB chunk would make four
// write syscalls, four TCP sends and four wake-ups of the peer. Between hold
// and release (one chunk, connside_out.go) the records are gathered and go
// out in one write.
//
// crypto/tls may also write from its Read (alerts, TLS 1.3 key updates), on
// the reader goroutine: mu orders every write, so records never interleave
// out of order, and a record written while held waits for the release.
type recordBatcher struct {
	net.Conn
	mu      sync.Mutex
	holding bool
	buf     []byte
}

// newTLSSocket wraps nc for tls.Server or tls.Client.
func newTLSSocket(nc net.Conn) *recordBatcher { return &recordBatcher{Conn: nc} }

// Write implements net.Conn: gathered while held, written at once otherwise.
func (b *recordBatcher) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.holding {
		b.buf = append(b.buf, p...)
		return len(p), nil
	}
	return b.Conn.Write(p)
}

// hold starts gathering records. Called by the connSide's writer goroutine.
func (b *recordBatcher) hold() {
	b.mu.Lock()
	b.holding = true
	b.mu.Unlock()
}

// release writes what was gathered since hold, in one write, and stops
// gathering. Called by the connSide's writer goroutine.
func (b *recordBatcher) release() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.holding = false
	if len(b.buf) == 0 {
		return nil
	}
	_, err := b.Conn.Write(b.buf)
	if cap(b.buf) > 4*outChunkSize {
		b.buf = nil // a burst of records written from Read; do not keep its buffer
	} else {
		b.buf = b.buf[:0]
	}
	return err
}

// batcherOf returns the recordBatcher under c, if c is a tls.Conn made on one.
func batcherOf(c net.Conn) *recordBatcher {
	if tc, ok := c.(*tls.Conn); ok {
		b, _ := tc.NetConn().(*recordBatcher)
		return b
	}
	return nil
}
