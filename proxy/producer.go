package proxy

import (
	"time"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// Verdict tells the connection what to do with a frame a ProducerPath saw.
type Verdict uint8

const (
	// Forward sends the frame's original bytes on, unchanged.
	Forward Verdict = iota
	// Consumed means the ProducerPath took care of the frame (it may have
	// written other frames through Outputs); the original is dropped.
	Consumed
)

// Outputs lets a ProducerPath write frames in the middle of the stream.
// Frames the connection already accepted for forwarding are written first,
// so order is kept. Methods may be called only during the ProducerPath call
// that received the Outputs, on the connection's event loop; b is copied
// before they return.
type Outputs interface {
	ToBroker(b []byte)
	ToClient(b []byte)
}

// ProducerPath sees the producer-side frames of one client connection:
// PRODUCER, SEND and CLOSE_PRODUCER from the client, and PRODUCER_SUCCESS,
// SEND_RECEIPT, SEND_ERROR, CLOSE_PRODUCER, SUCCESS and ERROR from the broker. Every other
// frame bypasses it. It is the seam where the re-batching engine plugs in.
//
// Its methods run on the connection's event loop, one at a time, in stream
// order per direction; they must not block. The frame's bytes alias the
// connection's read buffer and are valid only during the call.
type ProducerPath interface {
	// FromClient handles a producer frame sent by the client.
	FromClient(f wire.Frame, out Outputs) (Verdict, error)
	// FromBroker handles a producer frame sent by the broker.
	FromBroker(f wire.Frame, out Outputs) (Verdict, error)
	// Tick lets the path act on time, for example flush a batch whose delay
	// has expired. The connection calls it on its loop once NextDeadline has
	// passed (with the ticker's resolution, about a quarter millisecond).
	Tick(now time.Time, out Outputs) error
	// NextDeadline returns when Tick is next needed; the zero Time means
	// never. It is read after every other call.
	NextDeadline() time.Time
	// Close is called once when the connection pair closes.
	Close()
}

// HeadForwarder is implemented by a ProducerPath that can let some SEND
// frames go on from their Head alone, before their metadata and payload
// have arrived, so a large frame is forwarded as its bytes come in
// (cut-through) instead of after the last one. ForwardHead returning true
// means exactly what FromClient returning Forward would have meant for the
// whole frame: the path has accounted for it, and FromClient is not called
// for it. False means the connection waits for the whole frame and calls
// FromClient. Called on the connection's event loop.
type HeadForwarder interface {
	ForwardHead(h wire.Head) bool
}

// Backlogger is implemented by a ProducerPath whose pending work can grow
// with the client's input. While Backlogged reports true the connection
// stops taking frames from the client (they wait in its read buffer, within
// HardBufferLimit) and reads on once it reports false, so a client that
// keeps more sends pending than the path holds is slowed, not cut off.
// Called on the connection's event loop after every path call.
type Backlogger interface {
	Backlogged() bool
}

// ConnInfo describes a connection to a ProducerPathFactory.
type ConnInfo struct {
	ID         uint64 // proxy-wide connection id, as logged
	ClientAddr string
	BrokerAddr string
	// MaxMessageSize is the broker's limit from CONNECTED (or the default).
	MaxMessageSize int
	// NewID allocates an id for a request or producer the path sends to the
	// broker itself (ids.go: one allocator per connection, above the
	// client's ids). Called on the connection's event loop.
	NewID func() uint64
	// Now is the connection's clock (time.Now unless a test injects one).
	Now func() time.Time
}

// ProducerPathFactory builds the ProducerPath of a connection once its
// broker handshake is done. It is called on the connection's event loop.
type ProducerPathFactory func(ConnInfo) ProducerPath

// isProducerFrame reports whether frames of type t travelling in direction
// d go through the ProducerPath.
func isProducerFrame(d direction, t pulsarpb.BaseCommand_Type) bool {
	switch t {
	case pulsarpb.BaseCommand_PRODUCER, pulsarpb.BaseCommand_SEND:
		return d == toBroker
	case pulsarpb.BaseCommand_CLOSE_PRODUCER:
		return true
	case pulsarpb.BaseCommand_PRODUCER_SUCCESS, pulsarpb.BaseCommand_SEND_RECEIPT, pulsarpb.BaseCommand_SEND_ERROR,
		pulsarpb.BaseCommand_SUCCESS, pulsarpb.BaseCommand_ERROR:
		// SUCCESS and ERROR answer requests; a path that sends its own requests (bucket
		// producers) takes the answers to them.
		return d == toClient
	}
	return false
}
