package proxy

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// Contract 8 (cut-through): a large SEND the producer path passes on from
// its command alone, and every MESSAGE, are forwarded as their bytes
// arrive; frames the proxy writes itself towards that side wait until the
// frame in transit has ended.

// largeSend is a 256 KiB SEND frame.
func largeSend(chunk bool) []byte {
	return wire.AppendSendFrame(nil, &wire.Send{ProducerID: 1, SequenceID: 5, IsChunk: chunk},
		[]byte{0x0a, 0x01, 'p', 0x10, 0x05, 0x18, 0x01}, bytes.Repeat([]byte{0xab}, 256<<10))
}

// largeMessage is a 256 KiB MESSAGE frame.
func largeMessage(t *testing.T) []byte {
	t.Helper()
	b, err := wire.AppendPayloadFrame(nil, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_MESSAGE.Enum(),
		Message: &pulsarpb.CommandMessage{ConsumerId: proto.Uint64(3), MessageId: &pulsarpb.MessageIdData{LedgerId: proto.Uint64(1), EntryId: proto.Uint64(2)}}},
		&pulsarpb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(1), PublishTime: proto.Uint64(1)},
		bytes.Repeat([]byte{0xcd}, 256<<10))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// readSome reads what arrives on c within d (at most len(buf) bytes).
func readSome(c net.Conn, d time.Duration, max int) []byte {
	buf := make([]byte, max)
	n := 0
	deadline := time.Now().Add(d)
	for n < max {
		_ = c.SetReadDeadline(deadline)
		m, err := c.Read(buf[n:])
		n += m
		if err != nil {
			break
		}
	}
	return buf[:n]
}

func readExactly(t *testing.T, c net.Conn, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("reading %d bytes: %v", n, err)
	}
	return b
}

// Given an established pair,
// when one side has sent only the first half of a large frame,
// then the other side already receives that half, and the whole frame
// unchanged once the rest is sent — for SENDs of a passthrough producer
// and MESSAGEs, but not for chunks, which duplicate removal reads whole, nor for
// frames under 16 KiB, which are cheaper to gather.
func TestLargeFramesForwardedAsTheyArrive(t *testing.T) {
	cases := []struct {
		name       string
		fromClient bool
		frame      func(t *testing.T) []byte
		cutThrough bool
	}{
		{"SEND of a passthrough producer", true, func(*testing.T) []byte { return largeSend(false) }, true},
		{"MESSAGE to a consumer", false, largeMessage, true},
		{"chunk SEND", true, func(*testing.T) []byte { return largeSend(true) }, false},
		{"SEND under 16 KiB", true, func(*testing.T) []byte {
			return wire.AppendSendFrame(nil, &wire.Send{ProducerID: 1, SequenceID: 5}, []byte{0x0a, 0x01, 'p'}, bytes.Repeat([]byte{1}, 8<<10))
		}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fb := newFakeBroker(t)
			_, addr, _ := startProxy(t, []string{fb.addr()}, nil)
			client, broker := handshake(t, addr, fb, "")
			from, to := client, broker
			if !c.fromClient {
				from, to = broker, client
			}
			f := c.frame(t)
			half := len(f) / 2
			send(t, from, f[:half])

			got := readSome(to, 300*time.Millisecond, half)

			if c.cutThrough && !bytes.Equal(got, f[:half]) {
				t.Fatalf("%d of the first %d bytes arrived before the rest was sent", len(got), half)
			}
			if !c.cutThrough && len(got) != 0 {
				t.Fatalf("%d bytes of an incomplete chunk were forwarded", len(got))
			}
			send(t, from, f[half:])
			if rest := readExactly(t, to, len(f)-len(got)); !bytes.Equal(append(got, rest...), f) {
				t.Fatal("the frame arrived changed")
			}
		})
	}
}

// halfSendInTransit connects a client through a proxy whose connections use path (nil: the
// default) and has the first half of largeSend(false) cut through to the broker.
func halfSendInTransit(t *testing.T, path ProducerPath) (client, broker net.Conn, logs *logBuffer) {
	t.Helper()
	fb := newFakeBroker(t)
	_, addr, logs := startProxy(t, []string{fb.addr()}, func(c *Config) {
		if path != nil {
			c.ProducerPaths = func(ConnInfo) ProducerPath { return path }
		}
	})
	client, broker = handshake(t, addr, fb, "")
	f := largeSend(false)
	send(t, client, f[:len(f)/2])
	readExactly(t, broker, len(f)/2)
	return client, broker, logs
}

// pingOnReceipt is a producer path that, like a re-batching engine
// flushing on a receipt, writes a frame of its own to the broker whenever
// the broker acknowledges a send.
type pingOnReceipt struct{ forwardPath }

func (pingOnReceipt) FromBroker(f wire.Frame, out Outputs) (Verdict, error) {
	if f.Type() == pulsarpb.BaseCommand_SEND_RECEIPT {
		out.ToBroker(wire.AppendPingFrame(nil))
	}
	return Forward, nil
}

// Given a SEND half forwarded to the broker,
// when the producer path writes a frame of its own to the broker,
// then that frame reaches the broker after the SEND's last byte, not inside it.
func TestProxyFramesWaitForTheFrameInTransit(t *testing.T) {
	client, broker, _ := halfSendInTransit(t, pingOnReceipt{})
	f, half := largeSend(false), len(largeSend(false))/2

	send(t, broker, wire.AppendSendReceiptFrame(nil, &wire.SendReceipt{ProducerID: 9, SequenceID: 1}))

	expect(t, client, pulsarpb.BaseCommand_SEND_RECEIPT)
	if early := readSome(broker, 200*time.Millisecond, 64); len(early) != 0 {
		t.Fatalf("%d bytes reached the broker inside the SEND in transit", len(early))
	}
	send(t, client, f[half:])
	want := append(append([]byte(nil), f[half:]...), wire.AppendPingFrame(nil)...)
	if got := readExactly(t, broker, len(want)); !bytes.Equal(got, want) {
		t.Fatal("the broker did not get the rest of the SEND followed by the proxy's PING")
	}
}

// Given a SEND half forwarded to the broker,
// when the client closes its connection,
// then the broker side is closed and the log names the truncated frame.
func TestClientLeavingMidCutThroughClosesBroker(t *testing.T) {
	client, broker, logs := halfSendInTransit(t, nil)

	client.Close()

	expectClosed(t, broker)
	logs.waitFor(t, "before the end of a frame being forwarded")
}

// backlogOnReceipt is a producer path that reports a backlog from the first receipt on, as a
// rewriting producer does when receipts release queued sends into a full engine.
type backlogOnReceipt struct {
	forwardPath
	on *bool
}

func (b backlogOnReceipt) FromBroker(f wire.Frame, _ Outputs) (Verdict, error) {
	if f.Type() == pulsarpb.BaseCommand_SEND_RECEIPT {
		*b.on = true
	}
	return Forward, nil
}

func (b backlogOnReceipt) Backlogged() bool { return *b.on }

// Given a SEND half forwarded to the broker,
// when the producer path starts reporting a backlog before the rest arrives,
// then the rest of that SEND still reaches the broker (a frame begun is finished), and
// only the client's next frame waits.
func TestBacklogNeverStopsAFrameInTransit(t *testing.T) {
	on := false
	client, broker, _ := halfSendInTransit(t, backlogOnReceipt{on: &on})
	f, half := largeSend(false), len(largeSend(false))/2
	send(t, broker, wire.AppendSendReceiptFrame(nil, &wire.SendReceipt{ProducerID: 9, SequenceID: 1}))
	expect(t, client, pulsarpb.BaseCommand_SEND_RECEIPT)

	send(t, client, append(append([]byte(nil), f[half:]...), wire.AppendPingFrame(nil)...))

	if rest := readExactly(t, broker, len(f)-half); !bytes.Equal(rest, f[half:]) {
		t.Fatal("the rest of the SEND arrived changed")
	}
	if next := readSome(broker, 200*time.Millisecond, 64); len(next) != 0 {
		t.Fatalf("%d bytes of the client's next frame passed during the backlog", len(next))
	}
}

// bigWriteOnReceipt is a producer path that writes n bytes of frames of its own to the broker
// when the broker acknowledges a send.
type bigWriteOnReceipt struct {
	forwardPath
	n int
}

func (b bigWriteOnReceipt) FromBroker(f wire.Frame, out Outputs) (Verdict, error) {
	if f.Type() == pulsarpb.BaseCommand_SEND_RECEIPT {
		var buf []byte
		for len(buf) < b.n {
			buf = wire.AppendPingFrame(buf)
		}
		out.ToBroker(buf)
	}
	return Forward, nil
}

// Contract 7 for held frames: given a SEND half forwarded to the broker through a proxy whose
// hard buffer limit is 1 MiB,
// when the producer path writes more than that towards the broker meanwhile,
// then the pair is closed with a logged buffer-limit reason instead of holding it all.
func TestHeldFramesAreBounded(t *testing.T) {
	fb := newFakeBroker(t)
	_, addr, logs := startProxy(t, []string{fb.addr()}, func(c *Config) {
		c.MaxMessageSize, c.SoftBufferLimit, c.HardBufferLimit = 512<<10, 64<<10, 1<<20
		c.ProducerPaths = func(ConnInfo) ProducerPath { return bigWriteOnReceipt{n: 2 << 20} }
	})
	client, broker := handshake(t, addr, fb, "")
	f := largeSend(false)
	send(t, client, f[:len(f)/2])
	readExactly(t, broker, len(f)/2)

	send(t, broker, wire.AppendSendReceiptFrame(nil, &wire.SendReceipt{ProducerID: 9, SequenceID: 1}))

	expectClosed(t, client)
	logs.waitFor(t, "held behind a frame in transit")
}
