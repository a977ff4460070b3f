package proxy

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"os"
	"sync/atomic"
	"testing"

	"github.com/rebatchproxy/rebatchproxy/internal/testcert"
)

// countingConn counts the writes that reach the socket.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// Given a TLS connection whose socket is a recordBatcher,
// when two 64 KiB chunks (four TLS records each) are written through writeChunks,
// then the socket sees one write per chunk and the peer reads every byte in order.
func TestRecordBatcherWritesAChunksRecordsAtOnce(t *testing.T) {
	files, err := testcert.Write(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(files.ServerCert, files.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	pem, _ := os.ReadFile(files.CA)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	w, r := connPair(t, "tcp")
	counted := &countingConn{Conn: w}
	server := tls.Server(newTLSSocket(counted), &tls.Config{Certificates: []tls.Certificate{cert}})
	client := tls.Client(r, &tls.Config{RootCAs: pool, ServerName: "localhost"})
	want := bytes.Repeat([]byte("0123456789abcdef"), 2*outChunkSize/16)
	got := make(chan []byte)
	go func() { b, _ := io.ReadAll(client); got <- b }()
	if err := server.Handshake(); err != nil {
		t.Fatal(err)
	}
	var q outQueue
	q.append(want)
	chunks := q.take(nil)
	before := counted.writes.Load()

	n, _, err := writeChunks(server, batcherOf(server), chunks, nil)

	writes := counted.writes.Load() - before
	releaseChunks(chunks)
	server.Close()
	if err != nil || n != int64(len(want)) {
		t.Fatalf("wrote %d, %v", n, err)
	}
	if writes != 2 {
		t.Errorf("%d socket writes for 2 chunks of 4 records, want 2", writes)
	}
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("read %d bytes, not the %d written in order", len(b), len(want))
	}
}
