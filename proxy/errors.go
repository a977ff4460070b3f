package proxy

import "errors"

// Close reasons. A connection pair is closed with one of these; the reason
// is logged with the client address and counted in
// rebatchproxy_closes_total{reason}.
var (
	// ErrOutOfOrder means a peer sent a command the protocol does not allow
	// in the connection's state: anything but CONNECT first, anything but
	// AUTH_RESPONSE from the client before CONNECTED, a second CONNECT, or a
	// command only brokers send arriving from the client.
	ErrOutOfOrder = errors.New("proxy: command out of order")

	// ErrTargetRefused means a CONNECT named a proxy_to_broker_url that is
	// neither configured nor learned from a lookup answer (contract 6).
	ErrTargetRefused = errors.New("proxy: target broker cannot be validated")

	// ErrBrokerUnreachable means the broker could not be dialled within the
	// connect timeout.
	ErrBrokerUnreachable = errors.New("proxy: broker unreachable")

	// ErrHandshakeTimeout means CONNECTED was not relayed within the
	// handshake timeout.
	ErrHandshakeTimeout = errors.New("proxy: handshake timeout")

	// ErrIdleTimeout means no byte moved in either direction for the idle
	// timeout.
	ErrIdleTimeout = errors.New("proxy: idle timeout")

	// ErrWrongProtocol means a connection's first bytes are an HTTP request
	// or a TLS handshake, not a Pulsar frame: the client has the wrong port.
	ErrWrongProtocol = errors.New("proxy: not the Pulsar binary protocol")

	// ErrBufferLimit means one direction held more than the hard buffer
	// limit: the receiving side does not keep up (contract 7).
	ErrBufferLimit = errors.New("proxy: buffer limit exceeded")

	// ErrTruncated means a peer closed its connection in the middle of a
	// frame.
	ErrTruncated = errors.New("proxy: connection closed mid-frame")

	// ErrChunkDrainTimeout means the client left while chunks it sent were
	// still unacknowledged, and the broker did not acknowledge them within
	// the drain time; their fate stays unknown to duplicate-chunk removal.
	ErrChunkDrainTimeout = errors.New("proxy: chunk receipts not drained")

	// ErrInternal means a bug: handling the connection panicked. The
	// connection is closed; the panic and stack are logged.
	ErrInternal = errors.New("proxy: internal error")

	// ErrShutdown means the proxy closed the pair at the end of draining.
	ErrShutdown = errors.New("proxy: shutting down")
)
