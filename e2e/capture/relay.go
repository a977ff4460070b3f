package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// relayMaxMessageSize only bounds what the relay buffers per frame; it is
// far above any broker limit so the relay never rejects a real frame.
const relayMaxMessageSize = 64 << 20

// Relay accepts client connections on a loopback port, connects each to the
// broker, and copies bytes both ways while recording them. Client-to-broker
// bytes are forwarded untouched. Broker-to-client bytes are recorded as the
// broker sent them; two commands are rewritten on their way to the client
// (and the rewrite logged), because a capture is useless if the client
// leaves the relay or never chunks:
//   - LOOKUP_RESPONSE: broker URLs point at the relay, so the client's data
//     connection comes back through it instead of going to the broker;
//   - CONNECTED: when MaxMessageSize is set, max_message_size is lowered,
//     which makes clients without a chunk-size option (Python/C++) chunk.
type Relay struct {
	Broker         string // host:port of the real broker
	MaxMessageSize int32  // 0: leave CONNECTED alone

	ln net.Listener
	wg sync.WaitGroup

	mu    sync.Mutex
	conns []*recordedConn
	open  []net.Conn
}

// recordedConn is one client connection's two byte streams.
type recordedConn struct {
	mu        sync.Mutex
	c2b, b2c  []byte
	rewritten []string
	errs      []error
}

// Start listens on a free loopback port.
func (r *Relay) Start() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	r.ln = ln
	r.wg.Add(1)
	go r.accept()
	return nil
}

// URL is the service URL clients should use.
func (r *Relay) URL() string { return "pulsar://" + r.ln.Addr().String() }

func (r *Relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", r.Broker)
		if err != nil {
			c.Close()
			continue
		}
		rc := &recordedConn{}
		r.mu.Lock()
		r.conns = append(r.conns, rc)
		r.open = append(r.open, c, b)
		r.mu.Unlock()
		r.wg.Add(2)
		go r.clientToBroker(rc, c, b)
		go r.brokerToClient(rc, b, c)
	}
}

func (r *Relay) clientToBroker(rc *recordedConn, c, b net.Conn) {
	defer r.wg.Done()
	defer b.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			rc.mu.Lock()
			rc.c2b = append(rc.c2b, buf[:n]...)
			rc.mu.Unlock()
			if _, werr := b.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (r *Relay) brokerToClient(rc *recordedConn, b, c net.Conn) {
	defer r.wg.Done()
	defer c.Close()
	buf := make([]byte, 64<<10)
	var pending, out []byte
	var cmd pulsarpb.BaseCommand
	for {
		n, err := b.Read(buf)
		if n > 0 {
			pending = append(pending, buf[:n]...)
			rc.mu.Lock()
			rc.b2c = append(rc.b2c, buf[:n]...)
			rc.mu.Unlock()
			out = out[:0]
			for {
				f, used, ferr := wire.ReadFrame(pending, relayMaxMessageSize)
				if errors.Is(ferr, wire.ErrIncomplete) {
					break
				}
				if ferr != nil {
					rc.fail(fmt.Errorf("broker stream: %w", ferr))
					return
				}
				out = r.rewrite(rc, f, &cmd, out)
				pending = pending[used:]
			}
			if _, werr := c.Write(out); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				rc.fail(err)
			}
			return
		}
	}
}

// rewrite appends the frame the client should see to out.
func (r *Relay) rewrite(rc *recordedConn, f wire.Frame, cmd *pulsarpb.BaseCommand, out []byte) []byte {
	t := f.Type()
	if t != pulsarpb.BaseCommand_LOOKUP_RESPONSE && !(t == pulsarpb.BaseCommand_CONNECTED && r.MaxMessageSize > 0) {
		return append(out, f.Bytes()...)
	}
	if err := wire.DecodeCommand(f, cmd); err != nil {
		rc.fail(err)
		return append(out, f.Bytes()...)
	}
	switch t {
	case pulsarpb.BaseCommand_LOOKUP_RESPONSE:
		lr := cmd.GetLookupTopicResponse()
		if lr.BrokerServiceUrl == nil {
			return append(out, f.Bytes()...)
		}
		rc.note(fmt.Sprintf("LOOKUP_RESPONSE broker URL %s -> %s", lr.GetBrokerServiceUrl(), r.URL()))
		lr.BrokerServiceUrl = proto.String(r.URL())
		lr.BrokerServiceUrlTls = nil
	case pulsarpb.BaseCommand_CONNECTED:
		c := cmd.GetConnected()
		rc.note(fmt.Sprintf("CONNECTED max_message_size %d -> %d", c.GetMaxMessageSize(), r.MaxMessageSize))
		c.MaxMessageSize = proto.Int32(r.MaxMessageSize)
	}
	b, err := wire.AppendCommandFrame(out, cmd)
	if err != nil {
		rc.fail(err)
		return append(out, f.Bytes()...)
	}
	return b
}

func (rc *recordedConn) note(s string) {
	rc.mu.Lock()
	rc.rewritten = append(rc.rewritten, s)
	rc.mu.Unlock()
}

func (rc *recordedConn) fail(err error) {
	rc.mu.Lock()
	rc.errs = append(rc.errs, err)
	rc.mu.Unlock()
}

// Close stops accepting, closes every connection and waits for the copy
// goroutines, after which the recordings are complete.
func (r *Relay) Close() {
	r.ln.Close()
	r.mu.Lock()
	for _, c := range r.open {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// Recording is one connection's captured streams.
type Recording struct {
	C2B, B2C  []byte
	Rewritten []string
	Errors    []error
}

// Recordings returns the captured connections in accept order; call after
// Close.
func (r *Relay) Recordings() []Recording {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Recording, 0, len(r.conns))
	for _, rc := range r.conns {
		rc.mu.Lock()
		out = append(out, Recording{C2B: rc.c2b, B2C: rc.b2c, Rewritten: rc.rewritten, Errors: rc.errs})
		rc.mu.Unlock()
	}
	return out
}
