package proxy

import (
	"errors"
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// direction of a frame through the proxy.
type direction uint8

const (
	toBroker direction = iota // client -> broker
	toClient                  // broker -> client
)

func (d direction) String() string {
	if d == toBroker {
		return "client_to_broker"
	}
	return "broker_to_client"
}

// maxCommandType bounds the per-command counters; types above it (none
// today, 81 is the highest assigned) are counted under "OTHER".
const maxCommandType = 127

// counterShards spreads hot counters over several cache lines so that event
// loops counting frames of different connections rarely share one.
const counterShards = 8

type frameCounters struct {
	frames [2][maxCommandType + 1]atomic.Uint64
	bytes  [2][maxCommandType + 1]atomic.Uint64
}

// closeReason labels of rebatchproxy_closes_total, in a fixed order.
var closeReasons = [...]string{
	"client_closed", "broker_closed", "out_of_order", "target_refused",
	"broker_unreachable", "handshake_timeout", "idle_timeout", "buffer_limit",
	"truncated", "frame_too_large", "corrupt_frame", "shutdown", "broker_error", "internal_error",
	"chunk_drain_timeout", "wrong_protocol",
}

const (
	reasonClientClosed = iota
	reasonBrokerClosed
	reasonOutOfOrder
	reasonTargetRefused
	reasonBrokerUnreachable
	reasonHandshakeTimeout
	reasonIdleTimeout
	reasonBufferLimit
	reasonTruncated
	reasonFrameTooLarge
	reasonCorruptFrame
	reasonShutdown
	reasonBrokerError
	reasonInternal
	reasonChunkDrain
	reasonWrongProtocol
)

// reasonIndex maps a close error to its label.
func reasonIndex(err error) int {
	switch {
	case errors.Is(err, ErrOutOfOrder):
		return reasonOutOfOrder
	case errors.Is(err, ErrTargetRefused):
		return reasonTargetRefused
	case errors.Is(err, ErrBrokerUnreachable):
		return reasonBrokerUnreachable
	case errors.Is(err, ErrHandshakeTimeout):
		return reasonHandshakeTimeout
	case errors.Is(err, ErrIdleTimeout):
		return reasonIdleTimeout
	case errors.Is(err, ErrBufferLimit):
		return reasonBufferLimit
	case errors.Is(err, ErrTruncated):
		return reasonTruncated
	case errors.Is(err, wire.ErrFrameTooLarge):
		return reasonFrameTooLarge
	case errors.Is(err, wire.ErrCorruptFrame), errors.Is(err, wire.ErrMalformedCommand):
		return reasonCorruptFrame
	case errors.Is(err, ErrShutdown):
		return reasonShutdown
	case errors.Is(err, ErrInternal):
		return reasonInternal
	case errors.Is(err, ErrChunkDrainTimeout):
		return reasonChunkDrain
	case errors.Is(err, ErrWrongProtocol):
		return reasonWrongProtocol
	}
	return reasonBrokerError
}

// lookup result labels of rebatchproxy_lookups_total.
const (
	lookupConnect = iota
	lookupRedirect
	lookupFailed
	lookupThrottled
	lookupPartitionedMetadata
	lookupRedirectFollowed
	lookupRedirectFailed
)

// "redirect" counts Redirect answers relayed to the client; "redirect_followed"
// chains of redirects the proxy followed to a Connect answer; "redirect_failed"
// chains the proxy gave up on (unreachable target, timeout, refused CONNECT,
// too many redirects), answered Failed(ServiceNotReady). A broker's Failed
// answer at the end of a chain counts as "failed".
var lookupResults = [...]string{"connect", "redirect", "failed", "throttled", "partitioned_metadata",
	"redirect_followed", "redirect_failed"}

// Web port results (rebatchproxy_web_requests_total), by index.
const (
	webForwarded = iota
	webRefused
	webBrokerError
	webToWorker
)

var webResults = [...]string{"forwarded", "refused", "broker_error", "forwarded_functions_worker"}

// Managed Key_Shared events (rebatchproxy_keyshared_events_total), by index.
const (
	ksGrant = iota
	ksRelease
	ksDrained
	ksDrainTimeout
	ksRefused
	ksRetry
	ksDropped
	ksBrokerClosed
	ksCloseKept
)

var ksEvents = [...]string{"grant", "release", "drained", "drain_timeout", "refused", "subscribe_retry", "message_dropped", "broker_closed", "client_close_kept"}

// metrics holds every counter of a Server. All fields are updated with
// atomics from event loops and read by Collect on the HTTP goroutine.
type metrics struct {
	shards               [counterShards]frameCounters
	connsOpen            [2]atomic.Int64 // by side: 0 client, 1 broker
	connsTotal           [2]atomic.Uint64
	closes               [len(closeReasons)]atomic.Uint64
	lookups              [len(lookupResults)]atomic.Uint64
	lookupsFlight        atomic.Int64
	pauses               [2]atomic.Uint64
	parks                [2]atomic.Uint64 // by direction of the frames read from the parked socket
	parked               atomic.Int64
	held                 func() int64
	budget               int64
	descParks            *prometheus.Desc
	descParked           *prometheus.Desc
	descHeld             *prometheus.Desc
	descBudget           *prometheus.Desc
	panics               atomic.Uint64
	tlsHandshakeFailures atomic.Uint64
	web                  [len(webResults)]atomic.Uint64
	keyShared            [len(ksEvents)]atomic.Uint64
	descKeyShared        *prometheus.Desc
	descWeb              *prometheus.Desc
	descTLSFailures      *prometheus.Desc
	knownBrokers         func() int
	// brokerPorts is set once the per-broker listeners are open.
	brokerPorts     atomic.Pointer[[]*brokerPort]
	descConnsOpen   *prometheus.Desc
	descConnsTotal  *prometheus.Desc
	descFrames      *prometheus.Desc
	descBytes       *prometheus.Desc
	descCloses      *prometheus.Desc
	descLookups     *prometheus.Desc
	descFlight      *prometheus.Desc
	descPauses      *prometheus.Desc
	descKnown       *prometheus.Desc
	descBrokerPorts *prometheus.Desc
	descPanics      *prometheus.Desc
}

func newMetrics() *metrics {
	return &metrics{
		descConnsOpen: prometheus.NewDesc("rebatchproxy_connections_open",
			"Open connections by side (client or broker).", []string{"side"}, nil),
		descConnsTotal: prometheus.NewDesc("rebatchproxy_connections_total",
			"Connections opened by side (client or broker).", []string{"side"}, nil),
		descFrames: prometheus.NewDesc("rebatchproxy_frames_total",
			"Frames forwarded or answered, by direction and command type.", []string{"direction", "command"}, nil),
		descBytes: prometheus.NewDesc("rebatchproxy_bytes_total",
			"Frame bytes (size prefix included), by direction and command type.", []string{"direction", "command"}, nil),
		descCloses: prometheus.NewDesc("rebatchproxy_closes_total",
			"Connection pairs closed, by reason; every reason but client_closed and broker_closed is an error.", []string{"reason"}, nil),
		descLookups: prometheus.NewDesc("rebatchproxy_lookups_total",
			"Lookup answers relayed (connect, redirect, failed), lookups refused for concurrency (throttled), partitioned-metadata answers, redirect chains followed by the proxy to a Connect answer (redirect_followed) or given up (redirect_failed).", []string{"result"}, nil),
		descFlight: prometheus.NewDesc("rebatchproxy_lookups_inflight",
			"LOOKUP and PARTITIONED_METADATA requests awaiting a broker answer.", nil, nil),
		descPauses: prometheus.NewDesc("rebatchproxy_backpressure_pauses_total",
			"Times forwarding in a direction paused because the receiving side was slow.", []string{"direction"}, nil),
		descParks: prometheus.NewDesc("rebatchproxy_backpressure_parks_total",
			"Times a socket was taken off its event loop so that TCP slows its sender, by the direction of the frames it sends: client_to_broker parks a client (its broker side or its receipts are slow), broker_to_client parks a broker connection (its client is slow).", []string{"direction"}, nil),
		descParked: prometheus.NewDesc("rebatchproxy_backpressure_parked_sockets",
			"Sockets off their event loop now (parked, or leaving or returning).", nil, nil),
		descHeld: prometheus.NewDesc("rebatchproxy_buffered_bytes",
			"Bytes the proxy holds for all connections: unread input and output queued towards slow sides.", nil, nil),
		descBudget: prometheus.NewDesc("rebatchproxy_memory_budget_bytes",
			"The memory budget (memory-budget): above it every direction pauses at 256 KiB queued.", nil, nil),
		descTLSFailures: prometheus.NewDesc("rebatchproxy_tls_handshake_failures_total",
			"Connections to the TLS listener closed because their TLS handshake failed (plaintext, untrusted or missing client certificate, timeout).", nil, nil),
		descWeb: prometheus.NewDesc("rebatchproxy_web_requests_total",
			"Web port requests: forwarded to a broker, forwarded to a functions worker (function-worker-web-url), refused by the proxy (a path it does not forward, a body too large), or failed towards the brokers or workers (unreachable, a redirect not followed).", []string{"result"}, nil),
		descKeyShared: prometheus.NewDesc("rebatchproxy_keyshared_events_total",
			"Proxy-managed Key_Shared subscriptions (buckets policy): buckets granted to a consumer (grant), consumers released for a rebalance (release) "+
				"after acknowledging everything they were sent (drained) or when key-shared-handoff-timeout passed first (drain_timeout: the broker redelivers what was unacknowledged), "+
				"consumers refused for want of a bucket (refused), subscribes retried after the broker refused overlapping ranges (subscribe_retry), "+
				"messages the broker sent a consumer already being closed, dropped for the broker to redeliver (message_dropped), consumers the broker closed itself (broker_closed), and clients' closes of a consumer just told to resubscribe that kept its place (client_close_kept).", []string{"event"}, nil),
		descBrokerPorts: prometheus.NewDesc("rebatchproxy_broker_port_connections_total",
			"Client connections accepted on each port per broker (broker-ports-listen, broker-ports-tls-listen): clients that looked their topics up over HTTP.", []string{"broker", "tls"}, nil),
		descKnown: prometheus.NewDesc("rebatchproxy_known_brokers",
			"Broker addresses a data connection may target (configured plus learned).", nil, nil),
		descPanics: prometheus.NewDesc("rebatchproxy_internal_errors_total",
			"Connections closed because handling them panicked (a bug; the log has the stack).", nil, nil),
	}
}

// countFrame records one frame. Called on event loops; allocation-free.
func (m *metrics) countFrame(shard uint32, d direction, t pulsarpb.BaseCommand_Type, n int) {
	i := int(t)
	if i < 0 || i > maxCommandType {
		i = 0
	}
	s := &m.shards[shard%counterShards]
	s.frames[d][i].Add(1)
	s.bytes[d][i].Add(uint64(n))
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.descConnsOpen, m.descConnsTotal, m.descFrames, m.descBytes,
		m.descCloses, m.descLookups, m.descFlight, m.descPauses, m.descKnown, m.descPanics,
		m.descParks, m.descParked, m.descHeld, m.descBudget, m.descTLSFailures, m.descWeb, m.descKeyShared, m.descBrokerPorts} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. Series of command types never
// seen are omitted.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	sides := [2]string{"client", "broker"}
	for i, s := range sides {
		ch <- prometheus.MustNewConstMetric(m.descConnsOpen, prometheus.GaugeValue, float64(m.connsOpen[i].Load()), s)
		ch <- prometheus.MustNewConstMetric(m.descConnsTotal, prometheus.CounterValue, float64(m.connsTotal[i].Load()), s)
	}
	for d := toBroker; d <= toClient; d++ {
		for t := 0; t <= maxCommandType; t++ {
			var frames, bytes uint64
			for s := range m.shards {
				frames += m.shards[s].frames[d][t].Load()
				bytes += m.shards[s].bytes[d][t].Load()
			}
			if frames == 0 {
				continue
			}
			name := "OTHER"
			if t != 0 {
				name = pulsarpb.BaseCommand_Type(t).String()
			}
			ch <- prometheus.MustNewConstMetric(m.descFrames, prometheus.CounterValue, float64(frames), d.String(), name)
			ch <- prometheus.MustNewConstMetric(m.descBytes, prometheus.CounterValue, float64(bytes), d.String(), name)
		}
		ch <- prometheus.MustNewConstMetric(m.descPauses, prometheus.CounterValue, float64(m.pauses[d].Load()), d.String())
		ch <- prometheus.MustNewConstMetric(m.descParks, prometheus.CounterValue, float64(m.parks[d].Load()), d.String())
	}
	for i, r := range closeReasons {
		ch <- prometheus.MustNewConstMetric(m.descCloses, prometheus.CounterValue, float64(m.closes[i].Load()), r)
	}
	for i, r := range lookupResults {
		ch <- prometheus.MustNewConstMetric(m.descLookups, prometheus.CounterValue, float64(m.lookups[i].Load()), r)
	}
	ch <- prometheus.MustNewConstMetric(m.descFlight, prometheus.GaugeValue, float64(m.lookupsFlight.Load()))
	ch <- prometheus.MustNewConstMetric(m.descPanics, prometheus.CounterValue, float64(m.panics.Load()))
	ch <- prometheus.MustNewConstMetric(m.descParked, prometheus.GaugeValue, float64(m.parked.Load()))
	ch <- prometheus.MustNewConstMetric(m.descTLSFailures, prometheus.CounterValue, float64(m.tlsHandshakeFailures.Load()))
	for i, r := range webResults {
		ch <- prometheus.MustNewConstMetric(m.descWeb, prometheus.CounterValue, float64(m.web[i].Load()), r)
	}
	for i, e := range ksEvents {
		ch <- prometheus.MustNewConstMetric(m.descKeyShared, prometheus.CounterValue, float64(m.keyShared[i].Load()), e)
	}
	ch <- prometheus.MustNewConstMetric(m.descBudget, prometheus.GaugeValue, float64(m.budget))
	if m.held != nil {
		ch <- prometheus.MustNewConstMetric(m.descHeld, prometheus.GaugeValue, float64(m.held()))
	}
	if m.knownBrokers != nil {
		ch <- prometheus.MustNewConstMetric(m.descKnown, prometheus.GaugeValue, float64(m.knownBrokers()))
	}
	if ports := m.brokerPorts.Load(); ports != nil {
		for _, bp := range *ports {
			ch <- prometheus.MustNewConstMetric(m.descBrokerPorts, prometheus.CounterValue, float64(bp.accepted.Load()), bp.broker, strconv.FormatBool(bp.tls))
		}
	}
}
