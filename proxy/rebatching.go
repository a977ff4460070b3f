package proxy

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rebatchproxy/rebatchproxy/rebatch"
	"github.com/rebatchproxy/rebatchproxy/route"
	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// Policies is the proxy's per-topic policy table. The table is swapped whole
// (SIGHUP reload): a producer takes the policy of the table current when its
// PRODUCER command passes, and keeps it for its life.
//
// Any goroutine may call its methods.
type Policies struct {
	m atomic.Pointer[route.Matcher[rebatch.Policy]]
}

// NewPolicies returns a table; nil means every topic is passthrough.
func NewPolicies(m *route.Matcher[rebatch.Policy]) *Policies {
	p := &Policies{}
	p.Store(m)
	return p
}

// Store replaces the table.
func (p *Policies) Store(m *route.Matcher[rebatch.Policy]) { p.m.Store(m) }

// Lookup returns the policy of a topic; passthrough when no rule matches.
func (p *Policies) Lookup(topic string) rebatch.Policy {
	if m := p.m.Load(); m != nil {
		if pol, _, ok := m.Match(topic); ok {
			return pol
		}
	}
	return rebatch.Policy{Kind: rebatch.Passthrough}
}

// RebatchMetrics are the producer-path metrics of the rewriting policies.
// They are safe for use from every event loop.
type RebatchMetrics struct {
	sends       *prometheus.CounterVec
	entries     *prometheus.CounterVec
	perEntry    *prometheus.HistogramVec
	flushes     *prometheus.CounterVec
	latency     *prometheus.HistogramVec
	engineErrs  *prometheus.CounterVec
	activeProds prometheus.Gauge
}

// NewRebatchMetrics creates the metrics; register them with Collectors.
func NewRebatchMetrics() *RebatchMetrics {
	return &RebatchMetrics{
		sends: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rebatchproxy_rebatch_client_sends_total",
			Help: "Client SEND commands taken by a rewriting policy."}, []string{"policy"}),
		entries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rebatchproxy_rebatch_entries_total",
			Help: "Entries sent to brokers by a rewriting policy: built by the proxy, or a client send forwarded verbatim."}, []string{"policy", "kind"}),
		perEntry: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rebatchproxy_rebatch_messages_per_entry",
			Help: "Messages in each entry sent to a broker by a rewriting policy.", Buckets: []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000}}, []string{"policy"}),
		flushes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rebatchproxy_rebatch_flushes_total",
			Help: "Why open batches were flushed."}, []string{"policy", "reason"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rebatchproxy_rebatch_send_to_receipt_seconds",
			Help: "Time from a client SEND reaching the proxy to its receipt leaving it.", Buckets: prometheus.ExponentialBuckets(0.0002, 2, 14)}, []string{"policy"}),
		engineErrs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rebatchproxy_rebatch_errors_total",
			Help: "Producer-path errors that closed a connection."}, []string{"policy", "error"}),
		activeProds: prometheus.NewGauge(prometheus.GaugeOpts{Name: "rebatchproxy_rebatch_producers",
			Help: "Client producers currently under a rewriting policy."}),
	}
}

// Collectors returns the metrics for registration.
func (m *RebatchMetrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.sends, m.entries, m.perEntry, m.flushes, m.latency, m.engineErrs, m.activeProds}
}

// RebatchPaths returns the ProducerPathFactory of the rewriting proxy: each
// producer gets the policy its topic matches when it is created; passthrough
// producers' frames are forwarded untouched.
func RebatchPaths(policies *Policies, m *RebatchMetrics, log *slog.Logger) ProducerPathFactory {
	if log == nil {
		log = slog.Default()
	}
	return func(info ConnInfo) ProducerPath {
		return &rebatchPath{
			policies: policies, m: m, info: info,
			log:       log.With("conn", info.ID, "client", info.ClientAddr, "broker", info.BrokerAddr),
			pending:   map[uint64]pendingProducer{},
			producers: map[uint64]*engine{},
		}
	}
}

// pendingProducer is a PRODUCER request awaiting the broker's answer.
type pendingProducer struct {
	producerID uint64
	topic      string
	policy     rebatch.Policy
}

// engine is one client producer under a rewriting policy.
type engine struct {
	p       *rebatch.Producer
	topic   string
	name    string
	kind    string
	closing bool // the client closed it; kept until its last receipt is out
	last    rebatch.Stats
}

// rebatchPath is the ProducerPath that runs the rebatch engine for producers
// under a rewriting policy. It lives on the connection's event loop.
//
// Contracts kept here (the engine keeps the rest, see package rebatch):
//   - A producer's policy is fixed when the broker accepts it
//     (PRODUCER_SUCCESS); producers of passthrough topics never touch the
//     engine and their frames stay original bytes.
//   - A broker CLOSE_PRODUCER (unload, transfer) ends the engine: entries in
//     flight will get no receipt on this producer, and the client resends
//     every pending send on its new producer, whose engine starts from the
//     new last_sequence_id.
//   - A client CLOSE_PRODUCER flushes the open batch first, so nothing the
//     client sent is left behind.
//   - An engine error (a receipt that matches nothing, a malformed send, too
//     many pending sends) closes the connection with a log line naming the
//     topic and producer: the client reconnects and resends, which is what
//     it does after any broken connection.
type rebatchPath struct {
	policies  *Policies
	m         *RebatchMetrics
	info      ConnInfo
	log       *slog.Logger
	pending   map[uint64]pendingProducer // request id -> producer
	producers map[uint64]*engine         // producer id -> engine
	cmd       pulsarpb.BaseCommand
	out       rebatch.Output
	deadline  time.Time
}

func (r *rebatchPath) FromClient(f wire.Frame, out Outputs) (Verdict, error) {
	switch f.Type() {
	case pulsarpb.BaseCommand_PRODUCER:
		if err := wire.DecodeCommand(f, &r.cmd); err != nil {
			return Forward, nil // the broker answers a malformed command itself
		}
		c := r.cmd.GetProducer()
		if c == nil {
			return Forward, nil
		}
		if e, ok := r.producers[c.GetProducerId()]; ok {
			// The client re-creates a producer (after the broker closed it) on this
			// connection: the old engine's entries will never be acknowledged.
			r.drop(c.GetProducerId(), e)
		}
		pol := r.policies.Lookup(c.GetTopic())
		if pol.Kind != rebatch.Passthrough {
			r.pending[c.GetRequestId()] = pendingProducer{producerID: c.GetProducerId(), topic: c.GetTopic(), policy: pol}
		}
		return Forward, nil
	case pulsarpb.BaseCommand_SEND:
		s, err := wire.ParseSend(f)
		if err != nil {
			return Forward, nil
		}
		e, ok := r.producers[s.ProducerID]
		if !ok {
			return Forward, nil
		}
		err = e.p.Send(time.Now(), f, &r.out)
		return r.emit(s.ProducerID, e, out, err)
	case pulsarpb.BaseCommand_CLOSE_PRODUCER:
		if err := wire.DecodeCommand(f, &r.cmd); err != nil {
			return Forward, nil
		}
		id := r.cmd.GetCloseProducer().GetProducerId()
		if e, ok := r.producers[id]; ok {
			e.closing = true
			if _, err := r.emit(id, e, out, e.p.Flush(&r.out)); err != nil {
				return Forward, err
			}
		}
		return Forward, nil
	}
	return Forward, nil
}

func (r *rebatchPath) FromBroker(f wire.Frame, out Outputs) (Verdict, error) {
	switch f.Type() {
	case pulsarpb.BaseCommand_PRODUCER_SUCCESS:
		if err := wire.DecodeCommand(f, &r.cmd); err != nil {
			return Forward, nil
		}
		ps := r.cmd.GetProducerSuccess()
		pp, ok := r.pending[ps.GetRequestId()]
		if !ok || !ps.GetProducerReady() {
			// Not ours, or an exclusive producer still waiting: a second
			// PRODUCER_SUCCESS will say it is ready.
			return Forward, nil
		}
		delete(r.pending, ps.GetRequestId())
		kind := string(pp.policy.Kind)
		cfg := rebatch.Config{
			Policy: pp.policy, ProducerID: pp.producerID, ProducerName: ps.GetProducerName(),
			MaxMessageSize: r.info.MaxMessageSize, LastSequenceID: ps.GetLastSequenceId(),
		}
		if r.m != nil {
			hist := r.m.perEntry.WithLabelValues(kind)
			lat := r.m.latency.WithLabelValues(kind)
			cfg.OnEntry = func(n int) { hist.Observe(float64(n)) }
			cfg.OnReceipt = func(t time.Time) { lat.Observe(time.Since(t).Seconds()) }
		}
		p, err := rebatch.NewProducer(cfg)
		if err != nil {
			// Policies are validated at load; this is a bug, not bad input.
			r.log.Error("rebatch: producer left passthrough", "topic", pp.topic, "producer_id", pp.producerID, "err", err)
			return Forward, nil
		}
		r.producers[pp.producerID] = &engine{p: p, topic: pp.topic, name: ps.GetProducerName(), kind: kind}
		if r.m != nil {
			r.m.activeProds.Inc()
		}
		r.log.Info("producer rebatched", "topic", pp.topic, "producer_id", pp.producerID, "producer", ps.GetProducerName(),
			"policy", kind, "last_sequence_id", ps.GetLastSequenceId())
		return Forward, nil
	case pulsarpb.BaseCommand_SEND_RECEIPT:
		rc, err := wire.ParseSendReceipt(f)
		if err != nil {
			return Forward, nil
		}
		e, ok := r.producers[rc.ProducerID]
		if !ok {
			return Forward, nil
		}
		return r.emit(rc.ProducerID, e, out, e.p.Receipt(rc, &r.out))
	case pulsarpb.BaseCommand_SEND_ERROR:
		if err := wire.DecodeCommand(f, &r.cmd); err != nil {
			return Forward, nil
		}
		se := r.cmd.GetSendError()
		e, ok := r.producers[se.GetProducerId()]
		if !ok {
			return Forward, nil
		}
		r.log.Warn("broker refused an entry", "topic", e.topic, "producer_id", se.GetProducerId(), "producer", e.name,
			"sequence_id", se.GetSequenceId(), "error", se.GetError().String(), "message", se.GetMessage())
		return r.emit(se.GetProducerId(), e, out, e.p.SendError(se.GetSequenceId(), se.GetError(), se.GetMessage(), &r.out))
	case pulsarpb.BaseCommand_CLOSE_PRODUCER:
		if err := wire.DecodeCommand(f, &r.cmd); err != nil {
			return Forward, nil
		}
		id := r.cmd.GetCloseProducer().GetProducerId()
		if e, ok := r.producers[id]; ok {
			r.log.Info("broker closed a rebatched producer; the client will resend", "topic", e.topic, "producer_id", id,
				"producer", e.name, "pending_sends", e.p.Pending())
			r.drop(id, e)
		}
		return Forward, nil
	}
	return Forward, nil
}

// emit writes what the engine produced, accounts for it, and turns an engine
// error into a connection error naming the producer.
func (r *rebatchPath) emit(id uint64, e *engine, out Outputs, err error) (Verdict, error) {
	if len(r.out.Broker) > 0 {
		out.ToBroker(r.out.Broker)
	}
	if len(r.out.Client) > 0 {
		out.ToClient(r.out.Client)
	}
	r.out.Broker, r.out.Client = r.out.Broker[:0], r.out.Client[:0]
	r.account(e)
	if e.closing && e.p.Pending() == 0 {
		r.drop(id, e)
	}
	r.updateDeadline()
	if err != nil {
		if r.m != nil {
			r.m.engineErrs.WithLabelValues(e.kind, errorLabel(err)).Inc()
		}
		return Consumed, fmt.Errorf("producer %d (%q) on %s: %w", id, e.name, e.topic, err)
	}
	return Consumed, nil
}

func errorLabel(err error) string {
	for _, c := range []struct {
		err   error
		label string
	}{
		{rebatch.ErrUnexpectedReceipt, "unexpected_receipt"},
		{rebatch.ErrMalformedSend, "malformed_send"},
		{rebatch.ErrTooManyPending, "too_many_pending"},
		{rebatch.ErrWrongProducer, "wrong_producer"},
	} {
		if errors.Is(err, c.err) {
			return c.label
		}
	}
	return "other"
}

// account adds the engine's counter deltas to the metrics.
func (r *rebatchPath) account(e *engine) {
	if r.m == nil {
		return
	}
	s := e.p.Stats()
	d := func(now, before uint64) float64 { return float64(now - before) }
	if v := d(s.ClientSends, e.last.ClientSends); v > 0 {
		r.m.sends.WithLabelValues(e.kind).Add(v)
	}
	if v := d(s.EntriesBuilt, e.last.EntriesBuilt); v > 0 {
		r.m.entries.WithLabelValues(e.kind, "built").Add(v)
	}
	if v := d(s.EntriesVerbatim, e.last.EntriesVerbatim); v > 0 {
		r.m.entries.WithLabelValues(e.kind, "verbatim").Add(v)
	}
	for _, f := range []struct {
		reason     string
		now, since uint64
	}{
		{"max_messages", s.FlushMaxMessages, e.last.FlushMaxMessages},
		{"max_bytes", s.FlushMaxBytes, e.last.FlushMaxBytes},
		{"max_delay", s.FlushDelay, e.last.FlushDelay},
		{"group_change", s.FlushGroup, e.last.FlushGroup},
		{"explicit", s.FlushExplicit, e.last.FlushExplicit},
	} {
		if v := d(f.now, f.since); v > 0 {
			r.m.flushes.WithLabelValues(e.kind, f.reason).Add(v)
		}
	}
	e.last = s
}

func (r *rebatchPath) drop(id uint64, e *engine) {
	delete(r.producers, id)
	if r.m != nil {
		r.m.activeProds.Dec()
	}
}

func (r *rebatchPath) updateDeadline() {
	r.deadline = time.Time{}
	for _, e := range r.producers {
		if d, ok := e.p.Deadline(); ok && (r.deadline.IsZero() || d.Before(r.deadline)) {
			r.deadline = d
		}
	}
}

// Tick flushes every open batch whose delay has expired.
func (r *rebatchPath) Tick(now time.Time, out Outputs) error {
	for id, e := range r.producers {
		if _, err := r.emit(id, e, out, e.p.Tick(now, &r.out)); err != nil {
			return err
		}
	}
	r.updateDeadline()
	return nil
}

// NextDeadline implements ProducerPath.
func (r *rebatchPath) NextDeadline() time.Time { return r.deadline }

// Close implements ProducerPath.
func (r *rebatchPath) Close() {
	for id, e := range r.producers {
		r.drop(id, e)
	}
}
