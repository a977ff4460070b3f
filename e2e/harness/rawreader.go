package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// RawEntry is one entry as the broker dispatches it over the binary protocol: its complete
// outer MessageMetadata (every field, including those the admin REST API does not expose,
// such as entry_hash_min/max) and its payload as stored (still compressed if it was).
type RawEntry struct {
	Ledger, Entry uint64
	Metadata      *pulsarpb.MessageMetadata
	Payload       []byte
}

// ReadRawEntries subscribes to a non-partitioned topic (or one partition) from its earliest
// entry with a throwaway subscription, over a plain protocol connection straight to the
// broker, and returns entries until they hold at least messages messages. The broker must own
// the topic (a standalone broker always does).
func (b *Broker) ReadRawEntries(ctx context.Context, topic string, messages int) ([]RawEntry, error) {
	rw, err := b.rawConnect(ctx)
	if err != nil {
		return nil, err
	}
	defer rw.c.Close()
	sub := fmt.Sprintf("harness-raw-%d", time.Now().UnixNano())
	if err := rw.send(&pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_SUBSCRIBE.Enum(), Subscribe: &pulsarpb.CommandSubscribe{
		Topic: proto.String(topic), Subscription: proto.String(sub), SubType: pulsarpb.CommandSubscribe_Exclusive.Enum(),
		ConsumerId: proto.Uint64(1), RequestId: proto.Uint64(1), Durable: proto.Bool(false),
		InitialPosition: pulsarpb.CommandSubscribe_Earliest.Enum(),
	}}); err != nil {
		return nil, err
	}
	if _, err := rw.expect(pulsarpb.BaseCommand_SUCCESS); err != nil {
		return nil, fmt.Errorf("subscribe to %s: %w", topic, err)
	}
	if err := rw.send(&pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_FLOW.Enum(), Flow: &pulsarpb.CommandFlow{
		ConsumerId: proto.Uint64(1), MessagePermits: proto.Uint32(uint32(max(messages, 1)) + 1000)}}); err != nil {
		return nil, err
	}
	var out []RawEntry
	got := 0
	for got < messages {
		f, err := rw.expect(pulsarpb.BaseCommand_MESSAGE)
		if err != nil {
			return out, fmt.Errorf("after %d of %d messages: %w", got, messages, err)
		}
		var cmd pulsarpb.BaseCommand
		if err := wire.DecodeCommand(f, &cmd); err != nil {
			return out, err
		}
		md := &pulsarpb.MessageMetadata{}
		if err := wire.DecodeMetadata(f.Metadata(), md); err != nil {
			return out, err
		}
		id := cmd.GetMessage().GetMessageId()
		out = append(out, RawEntry{Ledger: id.GetLedgerId(), Entry: id.GetEntryId(), Metadata: md, Payload: append([]byte(nil), f.Payload()...)})
		got += int(max(md.GetNumMessagesInBatch(), 1))
	}
	_ = rw.send(&pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_CLOSE_CONSUMER.Enum(), CloseConsumer: &pulsarpb.CommandCloseConsumer{
		ConsumerId: proto.Uint64(1), RequestId: proto.Uint64(2)}})
	return out, nil
}

// rawConn is a minimal Pulsar protocol connection for the harness.
type rawConn struct {
	c   net.Conn
	buf []byte
}

// rawConnect dials b and completes the CONNECT handshake (with the admin token when b has
// one) on a plain protocol connection bounded by ctx's deadline; the caller closes rw.c.
func (b *Broker) rawConnect(ctx context.Context) (*rawConn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", strings.TrimPrefix(b.ServiceURL, "pulsar://"))
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	rw := &rawConn{c: conn}
	connect := &pulsarpb.CommandConnect{ClientVersion: proto.String("rebatchproxy-harness"), ProtocolVersion: proto.Int32(20)}
	if b.AdminToken != "" {
		connect.AuthMethodName = proto.String("token")
		connect.AuthData = []byte(b.AdminToken)
	}
	if err := rw.send(&pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_CONNECT.Enum(), Connect: connect}); err != nil {
		conn.Close()
		return nil, err
	}
	if _, err := rw.expect(pulsarpb.BaseCommand_CONNECTED); err != nil {
		conn.Close()
		return nil, err
	}
	return rw, nil
}

func (r *rawConn) send(cmd *pulsarpb.BaseCommand) error {
	b, err := wire.AppendCommandFrame(nil, cmd)
	if err != nil {
		return err
	}
	_, err = r.c.Write(b)
	return err
}

// expect returns the next frame of type t, answering pings on the way; an ERROR frame or any
// other failure is an error.
func (r *rawConn) expect(t pulsarpb.BaseCommand_Type) (wire.Frame, error) {
	for {
		_, n, err := wire.ReadFrame(r.buf, 64<<20)
		if errors.Is(err, wire.ErrIncomplete) {
			chunk := make([]byte, 64<<10)
			k, rerr := r.c.Read(chunk)
			r.buf = append(r.buf, chunk[:k]...)
			if rerr != nil && (k == 0 || rerr != io.EOF) {
				return wire.Frame{}, rerr
			}
			continue
		}
		if err != nil {
			return wire.Frame{}, err
		}
		// Copy the frame out so the buffer can be compacted.
		fb := append([]byte(nil), r.buf[:n]...)
		r.buf = append(r.buf[:0], r.buf[n:]...)
		f, _, _ := wire.ReadFrame(fb, 64<<20)
		switch f.Type() {
		case t:
			return f, nil
		case pulsarpb.BaseCommand_PING:
			if err := r.send(&pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PONG.Enum(), Pong: &pulsarpb.CommandPong{}}); err != nil {
				return wire.Frame{}, err
			}
		case pulsarpb.BaseCommand_ERROR:
			var cmd pulsarpb.BaseCommand
			_ = wire.DecodeCommand(f, &cmd)
			return wire.Frame{}, fmt.Errorf("broker error %s: %s", cmd.GetError().GetError(), cmd.GetError().GetMessage())
		}
	}
}
