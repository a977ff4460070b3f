package main

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// TestRelay runs the relay between a scripted client and a scripted fake
// broker: client bytes must arrive untouched and be recorded, broker bytes
// must be recorded as sent, and only LOOKUP_RESPONSE and CONNECTED change
// on their way to the client.
func TestRelay(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	connected, _ := wire.AppendCommandFrame(nil, &pulsarpb.BaseCommand{
		Type:      pulsarpb.BaseCommand_CONNECTED.Enum(),
		Connected: &pulsarpb.CommandConnected{ServerVersion: proto.String("fake"), MaxMessageSize: proto.Int32(5 << 20)},
	})
	lookup, _ := wire.AppendCommandFrame(nil, &pulsarpb.BaseCommand{
		Type: pulsarpb.BaseCommand_LOOKUP_RESPONSE.Enum(),
		LookupTopicResponse: &pulsarpb.CommandLookupTopicResponse{
			BrokerServiceUrl: proto.String("pulsar://10.0.0.1:6650"), RequestId: proto.Uint64(1),
			Response: pulsarpb.CommandLookupTopicResponse_Connect.Enum(),
		},
	})
	pong := wire.AppendPongFrame(nil)
	brokerSends := bytes.Join([][]byte{connected, lookup, pong}, nil)
	clientSends := wire.AppendSendFrame(wire.AppendPingFrame(nil), &wire.Send{ProducerID: 1, SequenceID: 2}, []byte{0x10, 0x02}, []byte("x"))

	brokerGot := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		got := make([]byte, len(clientSends))
		_, _ = io.ReadFull(c, got)
		brokerGot <- got
		// Split the reply in two writes to exercise frame reassembly.
		_, _ = c.Write(brokerSends[:5])
		time.Sleep(20 * time.Millisecond)
		_, _ = c.Write(brokerSends[5:])
		_, _ = io.Copy(io.Discard, c)
	}()

	r := &Relay{Broker: ln.Addr().String(), MaxMessageSize: 4096}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", r.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(clientSends); err != nil {
		t.Fatal(err)
	}
	if got := <-brokerGot; !bytes.Equal(got, clientSends) {
		t.Fatal("broker received altered client bytes")
	}
	var seen []*pulsarpb.BaseCommand
	var buf []byte
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for len(seen) < 3 {
		tmp := make([]byte, 4096)
		n, err := c.Read(tmp)
		if err != nil {
			t.Fatal(err)
		}
		buf = append(buf, tmp[:n]...)
		for {
			f, used, err := wire.ReadFrame(buf, 0)
			if errors.Is(err, wire.ErrIncomplete) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			cmd := new(pulsarpb.BaseCommand)
			if err := wire.DecodeCommand(f, cmd); err != nil {
				t.Fatal(err)
			}
			seen = append(seen, cmd)
			buf = buf[used:]
		}
	}
	c.Close()
	r.Close()

	if got := seen[0].GetConnected().GetMaxMessageSize(); got != 4096 {
		t.Errorf("client saw max_message_size %d", got)
	}
	if got := seen[1].GetLookupTopicResponse().GetBrokerServiceUrl(); got != r.URL() {
		t.Errorf("client saw broker URL %q, want the relay %q", got, r.URL())
	}
	if seen[2].GetType() != pulsarpb.BaseCommand_PONG {
		t.Errorf("third frame %v", seen[2].GetType())
	}
	recs := r.Recordings()
	if len(recs) != 1 || !bytes.Equal(recs[0].C2B, clientSends) || !bytes.Equal(recs[0].B2C, brokerSends) {
		t.Fatalf("recordings differ from the bytes sent: %d connections", len(recs))
	}
	if len(recs[0].Rewritten) != 2 || len(recs[0].Errors) != 0 {
		t.Fatalf("rewritten %v, errors %v", recs[0].Rewritten, recs[0].Errors)
	}
}
