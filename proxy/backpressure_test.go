package proxy

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
	"google.golang.org/protobuf/proto"
)

// bpConfig is a proxy with small limits, so a few MiB exceed them.
func bpConfig(c *Config) {
	c.MaxMessageSize = 64 << 10
	c.SoftBufferLimit = 64 << 10
	c.HardBufferLimit = 256 << 10
	c.ReadBufferCap = 64 << 10
}

// sendFrames returns n SEND frames of size bytes of payload each.
func sendFrames(n, size int) []byte {
	payload := bytes.Repeat([]byte("x"), size)
	var b []byte
	for i := 0; i < n; i++ {
		b = wire.AppendSendFrame(b, &wire.Send{ProducerID: 1, SequenceID: uint64(i)}, []byte{0x0a, 0x01, 'p'}, payload)
	}
	return b
}

// messageFrames returns n MESSAGE frames of size bytes of payload each.
func messageFrames(t *testing.T, n, size int) []byte {
	payload := bytes.Repeat([]byte("m"), size)
	md := &pulsarpb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(1), PublishTime: proto.Uint64(1)}
	var b []byte
	for i := 0; i < n; i++ {
		cmd := &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_MESSAGE.Enum(), Message: &pulsarpb.CommandMessage{
			ConsumerId: proto.Uint64(1), MessageId: &pulsarpb.MessageIdData{LedgerId: proto.Uint64(1), EntryId: proto.Uint64(uint64(i))}}}
		var err error
		if b, err = wire.AppendPayloadFrame(b, cmd, md, payload); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// stallThenDrain writes all of data to w on a goroutine while r is not read
// for stall, checks the proxy meanwhile holds no more than bound and nobody
// was closed, then reads everything from r and compares it byte for byte.
func stallThenDrain(t *testing.T, srv *Server, w, r net.Conn, data []byte, stall time.Duration, bound int64) {
	t.Helper()
	wrote := make(chan error, 1)
	go func() {
		_, err := w.Write(data)
		wrote <- err
	}()
	var peak int64
	for end := time.Now().Add(stall); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		peak = max(peak, srv.held.Load())
	}
	select {
	case err := <-wrote:
		t.Fatalf("the writer was not slowed: all %d bytes taken while the reader read nothing (err %v)", len(data), err)
	default:
	}
	if peak > bound {
		t.Errorf("the proxy held %d bytes while the reader stalled; bound %d", peak, bound)
	}
	got := make([]byte, len(data))
	_ = r.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.ReadFull(r, got); err != nil {
		t.Fatalf("reading what was sent after the stall: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the reader got other bytes than were sent")
	}
	if err := <-wrote; err != nil {
		t.Fatalf("writer: %v", err)
	}
}

// Given a proxy with a 64 KiB soft and 256 KiB hard limit, and a broker that stops reading,
// when the client sends 64 MiB of SENDs,
// then the client is slowed by TCP (its writes block) while the proxy holds less than the hard
// limit, nobody is disconnected, and once the broker reads, it gets every byte in order.
func TestSlowBrokerSlowsTheClientInsteadOfDisconnectingIt(t *testing.T) {
	fb := newFakeBroker(t)
	srv, addr, logs := startProxy(t, []string{fb.addr()}, bpConfig)
	client, broker := handshake(t, addr, fb, "")

	stallThenDrain(t, srv, client, broker, sendFrames(2000, 32<<10), 2*time.Second, 256<<10)

	if n := srv.m.parks[toBroker].Load(); n == 0 {
		t.Error("the client was never parked")
	}
	if bytes.Contains([]byte(logs.String()), []byte("buffer limit")) {
		t.Errorf("hard limit reached:\n%s", logs)
	}
}

// Given a proxy with a 64 KiB soft and 256 KiB hard limit, and a client that stops reading,
// when the broker sends 64 MiB of MESSAGEs,
// then the broker is slowed by TCP, the proxy holds less than the hard limit, nobody is
// disconnected, and once the client reads, it gets every byte in order.
func TestSlowConsumerSlowsTheBrokerInsteadOfBeingDisconnected(t *testing.T) {
	fb := newFakeBroker(t)
	srv, addr, logs := startProxy(t, []string{fb.addr()}, bpConfig)
	client, broker := handshake(t, addr, fb, "")

	stallThenDrain(t, srv, broker, client, messageFrames(t, 2000, 32<<10), 2*time.Second, 256<<10)

	if n := srv.m.parks[toClient].Load(); n == 0 {
		t.Error("the broker connection was never parked")
	}
	if bytes.Contains([]byte(logs.String()), []byte("buffer limit")) {
		t.Errorf("hard limit reached:\n%s", logs)
	}
}

// Given a proxy whose memory budget is 1 MiB (soft limit 4 MiB per direction), and four
// consumers that stop reading,
// when the broker sends each 16 MiB,
// then the proxy holds at most half the budget plus 256 KiB, a read and a frame per connection, and every
// consumer later gets all its bytes.
func TestMemoryBudgetBoundsStalledConsumers(t *testing.T) {
	fb := newFakeBroker(t)
	srv, addr, _ := startProxy(t, []string{fb.addr()}, func(c *Config) {
		c.MaxMessageSize = 64 << 10
		c.SoftBufferLimit = 4 << 20
		c.HardBufferLimit = 16 << 20
		c.ReadBufferCap = 64 << 10
		c.MemoryBudget = 1 << 20
	})
	const n = 4
	var clients, brokers [n]net.Conn
	for i := range clients {
		clients[i], brokers[i] = handshake(t, addr, fb, "")
	}
	data := messageFrames(t, 512, 32<<10)
	for i := range brokers {
		go func() { _, _ = brokers[i].Write(data) }()
	}
	var peak int64
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		peak = max(peak, srv.held.Load())
	}
	if bound := int64(1<<19 + n*(budgetSoftLimit+2*(64<<10+wire.MaxFrameLen(64<<10)))); peak > bound {
		t.Errorf("the proxy held %d bytes for %d stalled consumers; budget 1 MiB, bound %d", peak, n, bound)
	}
	for i := range clients {
		got := make([]byte, len(data))
		_ = clients[i].SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.ReadFull(clients[i], got); err != nil {
			t.Fatalf("consumer %d: %v", i, err)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("consumer %d got other bytes than were sent", i)
		}
	}
}

// Given a proxy with a 64 KiB soft and 256 KiB hard limit, a client that sends without ever
// reading and a broker that does the same (so neither side can be slowed: a side with bytes
// queued for it cannot be parked),
// when both send 64 MiB,
// then the pair is closed with the hard limit's log line, which says it is the last resort.
func TestHardLimitIsTheLastResortWhenNeitherSideReads(t *testing.T) {
	fb := newFakeBroker(t)
	_, addr, logs := startProxy(t, []string{fb.addr()}, bpConfig)
	client, broker := handshake(t, addr, fb, "")
	go func() { _, _ = client.Write(sendFrames(2000, 32<<10)) }()
	go func() { _, _ = broker.Write(messageFrames(t, 2000, 32<<10)) }()

	logs.waitFor(t, "buffer limit exceeded")
	logs.waitFor(t, "last resort")
	expectClosed(t, client)
}
