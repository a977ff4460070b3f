package proxy

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// panickyPath panics on every producer frame from the client: a stand-in for a bug.
type panickyPath struct{ forwardPath }

func (panickyPath) FromClient(wire.Frame, Outputs) (Verdict, error) { panic("boom") }

// Given a proxy whose producer path has a bug that panics,
// when one client sends a PRODUCER command,
// then only that connection is closed (the panic logged and counted) and another client's
// connection keeps forwarding.
func TestPanicClosesOnlyThatConnection(t *testing.T) {
	fb := newFakeBroker(t)
	srv, addr, logs := startProxy(t, []string{fb.addr()}, func(c *Config) {
		c.ProducerPaths = func(ConnInfo) ProducerPath { return panickyPath{} }
	})
	bad, _ := handshake(t, addr, fb, "")
	good, goodBroker := handshake(t, addr, fb, "")

	send(t, bad, frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PRODUCER.Enum(), Producer: &pulsarpb.CommandProducer{
		Topic: proto.String("persistent://a/b/c"), ProducerId: proto.Uint64(1), RequestId: proto.Uint64(1)}}))

	expectClosed(t, bad)
	logs.waitFor(t, "BUG: panic while handling a connection")
	ping := frame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PING.Enum(), Ping: &pulsarpb.CommandPing{}})
	send(t, good, ping)
	expect(t, goodBroker, pulsarpb.BaseCommand_PING)
	deadline := time.Now().Add(5 * time.Second)
	for srv.m.panics.Load() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("internal error counter = %d, want 1", srv.m.panics.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(logs.String(), "boom") {
		t.Fatal("the panic value is not in the log")
	}
}
