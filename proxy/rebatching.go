package proxy

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/chunkdedup"
	"github.com/rebatchproxy/rebatchproxy/keyshared"
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

// ManagedKeyShared is Config.ManagedKeyShared for this table: the bucket ring of a topic whose
// rule manages its Key_Shared subscriptions (rebatch.Policy.ManagesKeyShared), else nil. A
// subscription takes the table current when its first consumer subscribes.
func (p *Policies) ManagedKeyShared(topic string) keyshared.Ring {
	pol := p.Lookup(topic)
	if !pol.ManagesKeyShared() {
		return nil
	}
	if pol.Ring() == nil {
		return nil // not validated: the table's builder validates its rules (cmd/proxy does)
	}
	return pol.Ring()
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
	backlogs    *prometheus.CounterVec
	asBuilt     *prometheus.CounterVec
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
			Help: "Why open batches were flushed: max_messages, max_bytes, max_delay, group_change (properties, schema, a resend or a send never merged), key_change (split_keys: the next message routes to another Key_Shared hash), explicit, idle."}, []string{"policy", "reason"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rebatchproxy_rebatch_send_to_receipt_seconds",
			Help: "Time from a client SEND reaching the proxy to its receipt leaving it.", Buckets: prometheus.ExponentialBuckets(0.0002, 2, 14)}, []string{"policy"}),
		engineErrs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rebatchproxy_rebatch_errors_total",
			Help: "Producer-path errors that closed a connection."}, []string{"policy", "error"}),
		backlogs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rebatchproxy_rebatch_backlog_pauses_total",
			Help: "Times reading from a client stopped because one of its producers had 3/4 of max pending sends awaiting receipts."}, []string{"policy"}),
		asBuilt: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rebatchproxy_rebatch_sends_as_built_total",
			Help: "Client sends a rewriting policy could not rebuild safely for broker de-duplication and forwarded as the client built them " +
				"(numbering: more entries needed than the send has sequence ids; out_of_order: ids at or below ones already sent, for the broker to judge) " +
				"and pieces of resends sent as duplicates because an earlier attempt cut them differently (resend_cut_differently)."},
			[]string{"policy", "reason"}),
		activeProds: prometheus.NewGauge(prometheus.GaugeOpts{Name: "rebatchproxy_rebatch_producers",
			Help: "Client producers currently under a rewriting policy."}),
	}
}

// Collectors returns the metrics for registration.
func (m *RebatchMetrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.sends, m.entries, m.perEntry, m.flushes, m.latency, m.engineErrs, m.backlogs, m.asBuilt, m.activeProds}
}

// RebatchPaths returns the ProducerPathFactory of the rewriting proxy: each
// producer gets the policy its topic matches when it is created; passthrough
// producers' frames are forwarded untouched.
//
// chunks, when not nil, removes duplicate chunks (package chunkdedup) for every producer,
// whatever its policy.
func RebatchPaths(policies *Policies, m *RebatchMetrics, chunks *ChunkDedup, log *slog.Logger) ProducerPathFactory {
	if log == nil {
		log = slog.Default()
	}
	if policies == nil {
		policies = NewPolicies(nil)
	}
	return func(info ConnInfo) ProducerPath {
		if info.NewID == nil { // a path used outside a session (tests) numbers its own
			info.NewID = new(idAllocator).next
		}
		if info.Now == nil {
			info.Now = time.Now
		}
		return &rebatchPath{
			policies: policies, m: m, info: info, chunks: chunks,
			known:         map[uint64]*prodInfo{},
			requests:      map[uint64]uint64{},
			inflightTok:   map[chunkdedup.Token]uint64{},
			queued:        map[uint64][]queuedSend{},
			waiting:       map[chunkdedup.Token]waitRef{},
			log:           log.With("conn", info.ID, "client", info.ClientAddr, "broker", info.BrokerAddr),
			pending:       map[uint64]pendingProducer{},
			producers:     map[uint64]*engine{},
			swallow:       map[uint64]struct{}{},
			retired:       map[uint64]struct{}{},
			shared:        map[string]*rebatch.SharedLane{},
			closedByProxy: map[uint64]struct{}{},
		}
	}
}

// pendingProducer is a PRODUCER request awaiting the broker's answer.
type pendingProducer struct {
	producerID uint64
	topic      string
	policy     rebatch.Policy
	// lane is what bucket and merged producers take of the client's PRODUCER (rebatch.OpenLanes).
	lane *pulsarpb.CommandProducer
}

// engine is one client producer under a rewriting policy.
type engine struct {
	p           *rebatch.Producer
	id          uint64 // the client's producer id
	topic       string
	name        string
	kind        string
	closing     bool // the client closed it; kept until its last receipt is out
	lanesClosed bool // CLOSE_PRODUCER was sent for its own lanes
	backlogged  bool // counted in rebatchPath.backlogged
	last        rebatch.Stats
	noted       uint8 // reasons already logged for sends forwarded as built (see account)
	// The counters account adds to after every send and receipt, looked up once.
	sendsC, builtC, verbatimC prometheus.Counter
	flushC                    [len(flushReasons)]prometheus.Counter // by flushReasons' index
	// shared: the engine writes through its topic's shared lane (merge_producers), whose
	// receipts it may take for the other members' sends (see emit).
	shared bool
	// held is the client's PRODUCER_SUCCESS, withheld until the bucket producers exist.
	held      *pulsarpb.CommandProducerSuccess
	heldReqID uint64
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
	producers map[uint64]*engine         // producer id (client's or a bucket lane's) -> engine
	cmd       pulsarpb.BaseCommand
	out       rebatch.Output
	// deadline is when Tick must run next: never later than any open batch's flush time,
	// possibly earlier (a batch that has left since; Tick then recomputes it). deadlineStale
	// says an engine other than the one emit is given may have changed (a held chunk
	// settled), so emit must look at every engine.
	deadline      time.Time
	deadlineStale bool
	// swallow holds requests of the path's own (newID) whose answers are the path's.
	// backlogged counts the engines above the backlog watermark (Backlogger).
	backlogged int
	swallow    map[uint64]struct{}
	opening    int      // engines waiting for their bucket producers
	refusals   logEvery // rate-limits the log line of SEND_ERRORs (lograte.go)
	// retired holds bucket producer ids of dropped engines: late broker frames about them
	// (receipts, CLOSE_PRODUCER) are not the client's and are dropped. Bounded.
	retired map[uint64]struct{}
	// closedByProxy holds client producer ids the path closed on the client's side (a lane
	// was closed); the broker's own CLOSE_PRODUCER for them is not forwarded again.
	closedByProxy map[uint64]struct{}

	// shared holds the lanes of coalesce with merge_producers, one per topic.
	shared map[string]*rebatch.SharedLane

	// Duplicate-chunk removal (nil chunks: off).
	chunks      *ChunkDedup
	known       map[uint64]*prodInfo        // every producer of the connection
	requests    map[uint64]uint64           // PRODUCER request id -> producer id
	tokSeq      uint32                      // numbers this connection's chunk tokens
	inflightTok map[chunkdedup.Token]uint64 // forwarded chunks awaiting their fate -> producer id
	waiting     map[chunkdedup.Token]waitRef
	events      []tagEvent
	// queued keeps a producer's frames in order behind a duplicate chunk held for its
	// original's fate (see deferFrame); queuedBytes counts the copies, bounded by
	// maxQueuedBytes. deferErr is an engine error met while releasing them.
	queued      map[uint64][]queuedSend
	queuedBytes int
	deferErr    error
}

// queuedSend is an item of a producer's queue behind a held duplicate chunk: the held chunk
// itself (waiting, until settled), or a later client frame of the producer (a SEND or its
// CLOSE_PRODUCER), copied and not yet handled.
type queuedSend struct {
	tok     chunkdedup.Token // a held chunk's token
	waiting bool
	settled bool       // a held chunk whose original's fate is known: ev
	ev      chunkEvent // applied when the item reaches the head of the queue
	frame   []byte     // a queued client frame
}

// maxQueuedBytes bounds the copies of sends kept in order behind held chunks, per
// connection. Beyond it sends go on at once (a promoted chunk may then land after them).
const maxQueuedBytes = 16 << 20

// prodInfo is what the path knows of any producer on the connection.
type prodInfo struct {
	topic, name string
	// resuming: the producer may be resuming sends made through another connection, here or
	// on another instance (mayBeResuming); its chunks may need a look at the topic.
	resuming bool
	looked   bool // a look at the topic was made for the producer's chunks on this connection
	// inflight counts sends forwarded untracked (no engine) whose receipt is still due; an
	// engine created later for the producer adopts them.
	inflight int
}

// waitRef is a duplicate chunk held until its original's fate is known.
type waitRef struct {
	producerID uint64
	send       uint64 // the engine's handle
	frame      []byte // a copy, forwarded if the original fails
}

// tagEvent is the fate of a forwarded chunk, reported by an engine.
type tagEvent struct {
	tok           chunkdedup.Token
	ledger, entry uint64
	failed        bool
}

const maxRetired = 4096

// newID returns an id for a producer or request of the path's own, from the
// connection's allocator (ids.go).
func (r *rebatchPath) newID() uint64 { return r.info.NewID() }

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
		delete(r.closedByProxy, c.GetProducerId())
		r.known[c.GetProducerId()] = &prodInfo{topic: c.GetTopic(), name: c.GetProducerName(), resuming: mayBeResuming(c)}
		r.requests[c.GetRequestId()] = c.GetProducerId()
		pol := r.policies.Lookup(c.GetTopic())
		if pol.Kind == rebatch.Buckets && c.GetProducerAccessMode() != pulsarpb.ProducerAccessMode_Shared {
			// Bucket producers share the topic with the client's producer; an exclusive
			// producer cannot have them.
			r.log.Warn("buckets policy needs a shared producer; passing this one through", "topic", c.GetTopic(),
				"producer_id", c.GetProducerId(), "access_mode", c.GetProducerAccessMode().String())
			pol = rebatch.Policy{Kind: rebatch.Passthrough}
		}
		if pol.Kind != rebatch.Passthrough {
			// Bucket and merged producers take what they share with this one from a copy (r.cmd is reused).
			r.pending[c.GetRequestId()] = pendingProducer{producerID: c.GetProducerId(), topic: c.GetTopic(), policy: pol,
				lane: proto.Clone(c).(*pulsarpb.CommandProducer)}
		}
		return Forward, nil
	case pulsarpb.BaseCommand_SEND:
		var s wire.Send
		if err := wire.ParseSendInto(f, &s); err != nil {
			return Forward, nil
		}
		e, unchanged := r.sendEngine(&s)
		switch {
		case unchanged:
			return Forward, nil
		case e != nil && len(r.queued[e.id]) > 0 && r.deferFrame(e, f):
			return r.emit(e.id, e, out, nil)
		case s.IsChunk && r.chunks != nil:
			return r.chunkSend(e, f, &s, out)
		}
		return r.emit(s.ProducerID, e, out, e.p.SendParsed(r.info.Now(), &f, &s, &r.out))
	case pulsarpb.BaseCommand_CLOSE_PRODUCER:
		if err := wire.DecodeCommand(f, &r.cmd); err != nil {
			return Forward, nil
		}
		id := r.cmd.GetCloseProducer().GetProducerId()
		e, ok := r.producers[id]
		if ok && e.id == id && len(r.queued[id]) > 0 && r.deferFrame(e, f) {
			return r.emit(id, e, out, nil) // closed in its turn, after the sends queued before it
		}
		err := r.closeProducer(id)
		if ok && e.id == id {
			if _, err = r.emit(id, e, out, err); err != nil {
				return Forward, err
			}
		}
		return Forward, err
	}
	return Forward, nil
}

// closeProducer handles the client's CLOSE_PRODUCER of producer id: its open batches are
// flushed and its lanes closed; the engine stays until its last receipt is out.
func (r *rebatchPath) closeProducer(id uint64) error {
	delete(r.known, id)
	e, ok := r.producers[id]
	if !ok || e.id != id {
		return nil
	}
	e.closing = true
	reqs, err := e.p.CloseLanes(r.newID, true, &r.out)
	for _, q := range reqs {
		r.swallow[q] = struct{}{}
	}
	e.lanesClosed = true
	return err
}

// ForwardHead implements HeadForwarder: a SEND of a producer without an
// engine (passthrough) that is not a chunk goes on from its command alone,
// accounted as FromClient accounts it. Chunks wait whole (duplicate removal
// reads their metadata) and so do sends of rewriting producers.
func (r *rebatchPath) ForwardHead(h wire.Head) bool {
	s, err := wire.ParseSendHead(h)
	if err != nil {
		return false
	}
	_, unchanged := r.sendEngine(&s)
	return unchanged
}

// sendEngine returns the engine a client SEND goes to, or reports it goes on unchanged: its
// producer has no engine (passthrough) and it is not a chunk for duplicate removal. Such a
// send is counted, so that an engine created later for the producer adopts its receipt. A
// chunk of a producer without an engine yet gets (nil, false): chunkSend creates one.
func (r *rebatchPath) sendEngine(s *wire.Send) (e *engine, unchanged bool) {
	if e, ok := r.producers[s.ProducerID]; ok {
		return e, false
	}
	if s.IsChunk && r.chunks != nil {
		return nil, false
	}
	if info := r.known[s.ProducerID]; info != nil {
		info.inflight++
	}
	return nil, true
}

func (r *rebatchPath) FromBroker(f wire.Frame, out Outputs) (Verdict, error) {
	switch f.Type() {
	case pulsarpb.BaseCommand_PRODUCER_SUCCESS:
		if err := wire.DecodeCommand(f, &r.cmd); err != nil {
			return Forward, nil
		}
		ps := r.cmd.GetProducerSuccess()
		if isOwnID(ps.GetRequestId()) {
			return Consumed, r.laneOpened(ps, out)
		}
		if pid, ok := r.requests[ps.GetRequestId()]; ok && ps.GetProducerReady() {
			delete(r.requests, ps.GetRequestId())
			if info := r.known[pid]; info != nil {
				info.name = ps.GetProducerName()
				info.inflight = 0
			}
		}
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
			MaxPendingSends: pp.policy.MaxPendingSends,
		}
		if r.m != nil {
			hist := r.m.perEntry.WithLabelValues(kind)
			lat := r.m.latency.WithLabelValues(kind)
			cfg.OnEntry = func(n int) { hist.Observe(float64(n)) }
			cfg.OnReceipt = func(t time.Time) { lat.Observe(r.info.Now().Sub(t).Seconds()) }
		}
		cfg.OnTagged = r.onTagged
		if pp.policy.MergeProducers {
			sl, ok := r.shared[pp.topic]
			if !ok {
				sl = rebatch.NewSharedLane(fmt.Sprintf("rebatchproxy-%s-%d-%d", processNonce, r.info.ID, len(r.shared)))
				r.shared[pp.topic] = sl
			}
			cfg.Shared = sl
		}
		p, err := rebatch.NewProducer(cfg)
		if err != nil {
			// Policies are validated at load; this is a bug, not bad input.
			r.log.Error("rebatch: producer left passthrough", "topic", pp.topic, "producer_id", pp.producerID, "err", err)
			return Forward, nil
		}
		e := &engine{p: p, id: pp.producerID, topic: pp.topic, name: ps.GetProducerName(), kind: kind, shared: cfg.Shared != nil}
		r.producers[pp.producerID] = e
		if r.m != nil {
			r.m.activeProds.Inc()
		}
		r.log.Info("producer rebatched", "topic", pp.topic, "producer_id", pp.producerID, "producer", ps.GetProducerName(),
			"policy", kind, "last_sequence_id", ps.GetLastSequenceId())
		if p.Ready() {
			return Forward, nil
		}
		// Buckets: create the bucket producers first; the client learns its producer is
		// ready (with a last_sequence_id covering every bucket) once they all are.
		e.held, e.heldReqID = proto.Clone(ps).(*pulsarpb.CommandProducerSuccess), ps.GetRequestId()
		r.opening++
		err = p.OpenLanes(pp.topic, pp.lane, r.newID, &r.out)
		for _, id := range p.LaneProducers() {
			if _, taken := r.producers[id]; !taken { // a shared lane keeps its first engine
				r.producers[id] = e
			}
		}
		return r.emit(pp.producerID, e, out, err)
	case pulsarpb.BaseCommand_SEND_RECEIPT:
		rc, err := wire.ParseSendReceipt(f)
		if err != nil {
			return Forward, nil
		}
		e, ok := r.producers[rc.ProducerID]
		if !ok {
			if info := r.known[rc.ProducerID]; info != nil && info.inflight > 0 {
				info.inflight--
			}
			return r.unknown(rc.ProducerID), nil
		}
		return r.emit(e.id, e, out, e.p.Receipt(rc, &r.out))
	case pulsarpb.BaseCommand_SEND_ERROR:
		if err := wire.DecodeCommand(f, &r.cmd); err != nil {
			return Forward, nil
		}
		se := r.cmd.GetSendError()
		e, ok := r.producers[se.GetProducerId()]
		if !ok {
			if info := r.known[se.GetProducerId()]; info != nil && info.inflight > 0 {
				info.inflight--
			}
			return r.unknown(se.GetProducerId()), nil
		}
		if ok, suppressed := r.refusals.allow(r.info.Now()); ok {
			r.log.Warn("broker refused an entry (logged at most once per 10 s per connection)", "topic", e.topic, "producer_id", se.GetProducerId(),
				"producer", e.name, "sequence_id", se.GetSequenceId(), "error", se.GetError().String(), "message", se.GetMessage(),
				"suppressed_since_last", suppressed)
		}
		return r.emit(e.id, e, out, e.p.SendError(se.GetProducerId(), se.GetSequenceId(), se.GetError(), se.GetMessage(), &r.out))
	case pulsarpb.BaseCommand_CLOSE_PRODUCER:
		if err := wire.DecodeCommand(f, &r.cmd); err != nil {
			return Forward, nil
		}
		id := r.cmd.GetCloseProducer().GetProducerId()
		if _, ok := r.closedByProxy[id]; ok {
			return Consumed, nil // the client already had it closed
		}
		e, ok := r.producers[id]
		if !ok {
			return r.unknown(id), nil
		}
		if id != e.id {
			// A producer of the proxy's (a bucket or shared lane) was closed, by an unload
			// most likely: close the client's producer the same way, so it re-creates it and
			// resends what is pending. Its own CLOSE_PRODUCER from the broker, if one follows,
			// is then not the client's to see twice.
			r.log.Info("broker closed a proxy producer; closing the client's producer so it resends", "topic", e.topic,
				"producer_id", e.id, "producer", e.name, "proxy_producer_id", id, "pending_sends", e.p.Pending())
			// As the broker's own would: its request id, and the broker the topic moved to (the
			// extensible load manager names it), so the client goes there without a lookup.
			cp := r.cmd.GetCloseProducer()
			b, err := wire.AppendCommandFrame(nil, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_CLOSE_PRODUCER.Enum(),
				CloseProducer: &pulsarpb.CommandCloseProducer{ProducerId: proto.Uint64(e.id), RequestId: proto.Uint64(cp.GetRequestId()),
					AssignedBrokerServiceUrl: cp.AssignedBrokerServiceUrl, AssignedBrokerServiceUrlTls: cp.AssignedBrokerServiceUrlTls}})
			if err != nil {
				return Consumed, err
			}
			r.closeOnBroker(e.id)
			if len(r.closedByProxy) > maxRetired {
				clear(r.closedByProxy)
			}
			r.closedByProxy[e.id] = struct{}{}
			r.drop(e.id, e)
			r.writeOut(out)
			out.ToClient(b)
			return Consumed, nil
		}
		r.log.Info("broker closed a rebatched producer; the client will resend", "topic", e.topic, "producer_id", id,
			"producer", e.name, "pending_sends", e.p.Pending())
		// drop closes the bucket producers too (the broker may have closed them already; its
		// answers are swallowed either way), so the client's new producer can create them.
		r.drop(id, e)
		_, _ = r.emit(id, e, out, nil)
		return Forward, nil
	case pulsarpb.BaseCommand_SUCCESS, pulsarpb.BaseCommand_ERROR:
		// Rare frames: decode them, so answers to the path's own requests (ids from
		// ownIDBase) never reach the client.
		if err := wire.DecodeCommand(f, &r.cmd); err != nil {
			return Forward, nil
		}
		var req uint64
		if f.Type() == pulsarpb.BaseCommand_SUCCESS {
			req = r.cmd.GetSuccess().GetRequestId()
		} else {
			req = r.cmd.GetError().GetRequestId()
		}
		if !isOwnID(req) {
			if f.Type() == pulsarpb.BaseCommand_ERROR {
				// A refused PRODUCER: forget the request.
				delete(r.requests, req)
				delete(r.pending, req)
			}
			return Forward, nil
		}
		delete(r.swallow, req)
		if f.Type() == pulsarpb.BaseCommand_ERROR {
			return Consumed, r.laneFailed(req, r.cmd.GetError(), out)
		}
		return Consumed, nil
	}
	return Forward, nil
}

// writeOut writes what engines produced.
func (r *rebatchPath) writeOut(out Outputs) {
	if len(r.out.Broker) > 0 {
		out.ToBroker(r.out.Broker)
	}
	if len(r.out.Client) > 0 {
		out.ToClient(r.out.Client)
	}
	r.out.Broker, r.out.Client = r.out.Broker[:0], r.out.Client[:0]
}

// unknown says what to do with a broker frame about a producer no engine has: drop it if it
// names a retired bucket producer (the client never knew it), forward it otherwise.
func (r *rebatchPath) unknown(id uint64) Verdict {
	if _, ok := r.retired[id]; ok || isOwnID(id) {
		return Consumed
	}
	return Forward
}

// laneOpened takes the broker's PRODUCER_SUCCESS for a bucket producer; when an engine's
// last one arrives, the client gets its withheld PRODUCER_SUCCESS.
func (r *rebatchPath) laneOpened(ps *pulsarpb.CommandProducerSuccess, out Outputs) error {
	var owners []*engine
	for id, e := range r.producers {
		if id == e.id && e.held != nil && e.p.OwnsRequest(ps.GetRequestId()) {
			owners = append(owners, e)
		}
	}
	for _, e := range owners {
		if !e.p.LaneOpened(ps.GetRequestId(), ps.GetLastSequenceId()) {
			continue
		}
		r.opening--
		// The client resumes its sequence from this value (on its first connect), so it
		// covers what every bucket producer has persisted.
		e.held.LastSequenceId = proto.Int64(e.p.LastSequenceID())
		b, err := wire.AppendCommandFrame(nil, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PRODUCER_SUCCESS.Enum(), ProducerSuccess: e.held})
		if err != nil {
			return err
		}
		e.held = nil
		r.log.Info("proxy producers ready", "topic", e.topic, "producer_id", e.id, "producer", e.name,
			"lanes", len(e.p.LaneProducers()), "last_sequence_id", e.p.LastSequenceID())
		out.ToClient(b)
	}
	return nil
}

// laneFailed handles the broker refusing a bucket producer: the client's PRODUCER request
// fails with the broker's own error, and what was created is closed.
func (r *rebatchPath) laneFailed(req uint64, ce *pulsarpb.CommandError, out Outputs) error {
	var owners []*engine
	for id, e := range r.producers {
		if id == e.id && e.held != nil && e.p.OwnsRequest(req) {
			owners = append(owners, e)
		}
	}
	for _, e := range owners {
		r.log.Warn("broker refused a proxy producer; failing the client's producer", "topic", e.topic,
			"producer_id", e.id, "producer", e.name, "error", ce.GetError().String(), "message", ce.GetMessage())
		b, err := wire.AppendCommandFrame(nil, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_ERROR.Enum(), Error: &pulsarpb.CommandError{
			RequestId: proto.Uint64(e.heldReqID), Error: ce.Error, Message: ce.Message}})
		if err != nil {
			return err
		}
		r.closeOnBroker(e.id)
		r.drop(e.id, e)
		r.writeOut(out)
		out.ToClient(b)
	}
	return nil
}

// closeOnBroker sends CLOSE_PRODUCER for a producer of the client's that the proxy gives up
// on; the answer is the path's.
func (r *rebatchPath) closeOnBroker(id uint64) {
	req := r.newID()
	b, err := wire.AppendCommandFrame(nil, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_CLOSE_PRODUCER.Enum(),
		CloseProducer: &pulsarpb.CommandCloseProducer{ProducerId: proto.Uint64(id), RequestId: proto.Uint64(req)}})
	if err == nil {
		r.swallow[req] = struct{}{}
		r.out.Broker = append(r.out.Broker, b...)
	}
}

// emit writes what the engine produced, accounts for it, and turns an engine
// error into a connection error naming the producer.
func (r *rebatchPath) emit(id uint64, e *engine, out Outputs, err error) (Verdict, error) {
	r.processEvents()
	r.account(e)
	r.noteBacklog(e)
	if e.shared && r.backlogged > 0 {
		// A shared lane's receipts come to its first engine and release every member's sends.
		for _, o := range r.producers {
			if o.backlogged && o != e {
				r.noteBacklog(o)
			}
		}
	}
	if e.closing && e.p.Pending() == 0 {
		r.drop(id, e)
	}
	if r.deadlineStale {
		r.updateDeadline()
	} else {
		r.noteDeadline(e)
	}
	r.writeOut(out)
	if err != nil {
		if r.m != nil {
			r.m.engineErrs.WithLabelValues(e.kind, errorLabel(err)).Inc()
		}
		return Consumed, fmt.Errorf("producer %d (%q) on %s: %w", id, e.name, e.topic, err)
	}
	if err, r.deferErr = r.deferErr, nil; err != nil {
		return Consumed, err // a queued send's, named when it was met
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

// account adds the engine's counter deltas to the metrics, and logs the first send of each
// producer that the engine had to forward as the client built it (one line per producer and
// reason, so a client that numbers every send that way costs one line, not one per send).
func (r *rebatchPath) account(e *engine) { r.accountStats(e, e.p.Stats()) }

// accountStats is account with the engine's counters s.
func (r *rebatchPath) accountStats(e *engine, s rebatch.Stats) {
	d := func(now, before uint64) float64 { return float64(now - before) }
	for _, f := range []struct {
		reason     string
		bit        uint8
		now, since uint64
		why        string
	}{
		{"numbering", 1, s.SendsUnsplittable, e.last.SendsUnsplittable,
			"a send the policy would cut into more entries than its sequence ids can number (a batch numbered by one id mixing property groups, or keys under split_keys: pulsar-client-go before v0.10, pulsar-rs) is forwarded as the client built it"},
		{"out_of_order", 2, s.SendsOutOfOrder, e.last.SendsOutOfOrder,
			"a send numbered at or below ids already sent (application-supplied sequence ids out of order) is forwarded as built, for the broker's de-duplication to judge as it would directly"},
		{"resend_cut_differently", 4, s.PiecesStraddlingMark, e.last.PiecesStraddlingMark,
			"part of a resend straddles the broker's de-duplication mark (the first attempt was cut under another policy or limit); it is sent as a duplicate"},
	} {
		v := d(f.now, f.since)
		if v == 0 {
			continue
		}
		if r.m != nil {
			r.m.asBuilt.WithLabelValues(e.kind, f.reason).Add(v)
		}
		if e.noted&f.bit == 0 {
			e.noted |= f.bit
			r.log.Warn("producer's sequence ids cannot be rewritten safely; "+f.why+" (logged once per producer)", "topic", e.topic,
				"producer_id", e.id, "producer", e.name, "policy", e.kind, "reason", f.reason)
		}
	}
	if r.m == nil {
		e.last = s
		return
	}
	if e.sendsC == nil {
		e.sendsC = r.m.sends.WithLabelValues(e.kind)
		e.builtC, e.verbatimC = r.m.entries.WithLabelValues(e.kind, "built"), r.m.entries.WithLabelValues(e.kind, "verbatim")
	}
	if v := d(s.ClientSends, e.last.ClientSends); v > 0 {
		e.sendsC.Add(v)
	}
	if v := d(s.EntriesBuilt, e.last.EntriesBuilt); v > 0 {
		e.builtC.Add(v)
	}
	if v := d(s.EntriesVerbatim, e.last.EntriesVerbatim); v > 0 {
		e.verbatimC.Add(v)
	}
	flushes := [len(flushReasons)][2]uint64{
		{s.FlushMaxMessages, e.last.FlushMaxMessages},
		{s.FlushMaxBytes, e.last.FlushMaxBytes},
		{s.FlushDelay, e.last.FlushDelay},
		{s.FlushGroup, e.last.FlushGroup},
		{s.FlushKeys, e.last.FlushKeys},
		{s.FlushExplicit, e.last.FlushExplicit},
		{s.FlushIdle, e.last.FlushIdle},
	}
	for i, f := range flushes {
		if v := d(f[0], f[1]); v > 0 {
			if e.flushC[i] == nil {
				e.flushC[i] = r.m.flushes.WithLabelValues(e.kind, flushReasons[i])
			}
			e.flushC[i].Add(v)
		}
	}
	e.last = s
}

// flushReasons are the reason labels of rebatchproxy_rebatch_flushes_total, in the order
// account counts them.
var flushReasons = [...]string{"max_messages", "max_bytes", "max_delay", "group_change", "key_change", "explicit", "idle"}

func (r *rebatchPath) drop(id uint64, e *engine) {
	if r.producers[id] != e {
		return
	}
	if e.backlogged {
		e.backlogged = false
		r.backlogged--
	}
	e.p.Abandon()
	if !e.lanesClosed {
		e.lanesClosed = true
		reqs, _ := e.p.CloseLanes(r.newID, false, &r.out)
		for _, q := range reqs {
			r.swallow[q] = struct{}{}
		}
	}
	delete(r.producers, id)
	if len(r.retired) > maxRetired {
		clear(r.retired)
	}
	for _, lid := range e.p.LaneProducers() {
		if r.producers[lid] != e {
			continue // a shared lane routed through another engine
		}
		delete(r.producers, lid)
		if next := r.sharedMember(lid); next != nil {
			r.producers[lid] = next
			continue
		}
		r.retired[lid] = struct{}{}
		r.closeShared(lid)
	}
	if e.held != nil {
		e.held = nil
		r.opening--
	}
	if r.m != nil {
		r.m.activeProds.Dec()
	}
	if r.chunks == nil {
		return
	}
	for _, it := range r.queued[id] {
		r.queuedBytes -= len(it.frame)
	}
	delete(r.queued, id)
	for tok, w := range r.waiting {
		if w.producerID != id {
			continue
		}
		delete(r.waiting, tok)
		if r.chunks.cancel(tok) {
			continue
		}
		// Not a waiter any more: its outcome was decided (posted to the mailbox, or about to
		// be). An answer needs no one; a promotion made it the copy in flight, which nobody
		// will send now, so the next copy must go.
		if ev, ok := r.chunks.take(tok); !ok || ev.promote {
			r.events = append(r.events, tagEvent{tok: tok, failed: true})
		}
	}
	for tok, pid := range r.inflightTok {
		if pid == id {
			r.events = append(r.events, tagEvent{tok: tok, failed: true})
		}
	}
}

// Backlog watermarks, as fractions of an engine's MaxPending: reading from
// the client stops at the high one and resumes below the low one, so the
// client is slowed well before its sends would be refused.
const (
	backlogHigh = 0.75
	backlogLow  = 0.5
)

// heldBacklogHigh is the size of the frames an engine holds behind out-of-order sends
// (rebatch.Producer.HeldBytes) at which its client is slowed too; it reads on below half of it.
const heldBacklogHigh = 4 << 20

// noteBacklog updates e's backlog state after an engine call. Sends queued behind held
// duplicate chunks count too: they will be pending once released; so do the bytes the engine
// holds behind out-of-order sends.
func (r *rebatchPath) noteBacklog(e *engine) {
	n, max, held := e.p.Pending()+len(r.queued[e.id]), float64(e.p.MaxPending()), e.p.HeldBytes()
	switch {
	case !e.backlogged && (float64(n) >= backlogHigh*max || held >= heldBacklogHigh):
		e.backlogged = true
		r.backlogged++
		if r.m != nil {
			r.m.backlogs.WithLabelValues(e.kind).Inc()
		}
		r.log.Info("producer backlog high; reading from the client paused until receipts catch up",
			"topic", e.topic, "producer", e.name, "pending", n, "limit", e.p.MaxPending(), "held_bytes", held)
	case e.backlogged && float64(n) < backlogLow*max && held < heldBacklogHigh/2:
		e.backlogged = false
		r.backlogged--
		r.log.Debug("producer backlog drained; reading from the client again", "topic", e.topic, "producer", e.name, "pending", n)
	}
}

// Backlogged implements Backlogger: some producer has too many sends pending.
func (r *rebatchPath) Backlogged() bool { return r.backlogged > 0 }

// noteDeadline brings the path's deadline forward to e's earliest flush time, if sooner. It
// never moves it later, so a send costs the look at its own engine, not at every producer of
// the connection (64 synchronous producers made that scan a quarter of the proxy's CPU).
func (r *rebatchPath) noteDeadline(e *engine) {
	if d, ok := e.p.Deadline(); ok && (r.deadline.IsZero() || d.Before(r.deadline)) {
		r.deadline = d
	}
}

// updateDeadline recomputes the deadline from every engine.
func (r *rebatchPath) updateDeadline() {
	r.deadline, r.deadlineStale = time.Time{}, false
	for id, e := range r.producers {
		if id != e.id {
			continue
		}
		if d, ok := e.p.Deadline(); ok && (r.deadline.IsZero() || d.Before(r.deadline)) {
			r.deadline = d
		}
	}
}

// Tick flushes every open batch whose delay has expired.
func (r *rebatchPath) Tick(now time.Time, out Outputs) error {
	for tok := range r.waiting {
		if ev, ok := r.chunks.take(tok); ok {
			r.applyEvent(tok, ev)
		}
	}
	r.processEvents()
	r.writeOut(out)
	for id, e := range r.producers {
		if id != e.id {
			continue // a bucket lane; its engine is ticked under the client's id
		}
		if _, err := r.emit(id, e, out, e.p.Tick(now, &r.out)); err != nil {
			return err
		}
	}
	r.updateDeadline()
	return nil
}

// chunkPoll is how often a connection holding duplicate chunks looks for their outcome.
const chunkPoll = time.Millisecond

// NextDeadline implements ProducerPath.
func (r *rebatchPath) NextDeadline() time.Time {
	if len(r.waiting) > 0 {
		if poll := r.info.Now().Add(chunkPoll); r.deadline.IsZero() || poll.Before(r.deadline) {
			return poll
		}
	}
	return r.deadline
}

// Close implements ProducerPath. Chunks still in flight on this connection are reported
// failed, so a copy held elsewhere is forwarded there; copies held here are withdrawn.
func (r *rebatchPath) Close() {
	for id, e := range r.producers {
		if id == e.id {
			r.drop(id, e)
		}
	}
	r.processEvents()
}

// ClientGone is called when the client left but the broker side stays open to drain chunk
// receipts: open batches are dropped (their sends were never acknowledged, and the client
// resends them), and nothing more is flushed for this client.
func (r *rebatchPath) ClientGone() {
	for id, e := range r.producers {
		if id == e.id {
			e.p.DiscardOpen()
			e.p.Abandon()
		}
	}
	r.deadline = time.Time{}
}

// InFlightChunks reports how many forwarded chunks still await their receipt; the connection
// keeps its broker side open for them (bounded) after the client leaves, so the tracker
// learns where they were stored.
func (r *rebatchPath) InFlightChunks() int { return len(r.inflightTok) }

// newToken returns a chunk token unique in the process: the connection id and a counter.
func (r *rebatchPath) newToken() chunkdedup.Token {
	r.tokSeq++
	return chunkdedup.Token(r.info.ID<<32 | uint64(r.tokSeq))
}

// chunkSend handles a chunk from the client (any policy): the tracker decides whether it is
// forwarded or answered, and the producer's engine (created on its first chunk for a
// passthrough producer) keeps the receipts in the client's order.
func (r *rebatchPath) chunkSend(e *engine, f wire.Frame, s *wire.Send, out Outputs) (Verdict, error) {
	if e == nil {
		info := r.known[s.ProducerID]
		if info == nil || info.name == "" {
			return Forward, nil // not a producer the broker accepted on this connection
		}
		p, err := rebatch.NewProducer(rebatch.Config{TrackOnly: true, ProducerID: s.ProducerID, ProducerName: info.name,
			MaxMessageSize: r.info.MaxMessageSize, LastSequenceID: -1, Adopt: info.inflight, OnTagged: r.onTagged})
		if err != nil {
			return Forward, nil
		}
		e = &engine{p: p, id: s.ProducerID, topic: info.topic, name: info.name, kind: string(rebatch.Passthrough)}
		r.producers[s.ProducerID] = e
		if r.m != nil {
			r.m.activeProds.Inc()
		}
	}
	tok, err := r.sendChunk(e, f, s)
	if tok != 0 {
		r.queued[e.id] = append(r.queued[e.id], queuedSend{tok: tok, waiting: true})
	}
	return r.emit(e.id, e, out, err)
}

// sendChunk puts a chunk of producer e through duplicate-chunk removal and the engine (output
// in r.out). It returns the token of the chunk when it is now held for its original's fate:
// the caller queues it, so that what the client sends after it waits behind it.
func (r *rebatchPath) sendChunk(e *engine, f wire.Frame, s *wire.Send) (chunkdedup.Token, error) {
	now := r.info.Now()
	var md pulsarpb.MessageMetadata
	if !f.HasPayload() || wire.DecodeMetadata(f.Metadata(), &md) != nil || md.ChunkId == nil || md.GetNumChunksFromMsg() < 2 {
		return 0, e.p.SendParsed(now, &f, s, &r.out) // not a chunk the tracker can key
	}
	fp := ChunkFingerprint(f.Payload(), md.GetPublishTime(), md.GetUuid())
	tok := r.newToken()
	ch := chunkdedup.Chunk{Topic: e.topic, Producer: e.name, SequenceID: s.SequenceID,
		ChunkID: int(md.GetChunkId()), NumChunks: int(md.GetNumChunksFromMsg()), Fingerprint: fp, Token: tok}
	if info := r.known[e.id]; info != nil && info.resuming && !info.looked && r.chunks.canLook(e.topic) {
		// The producer's first chunk on this connection after a reconnect: held like a
		// duplicate waiting for its original until the look at the topic decides.
		info.looked = true
		id, err := e.p.Hold(now, s, &r.out)
		if err != nil {
			return 0, err
		}
		r.chunks.recover(ch)
		r.waiting[tok] = waitRef{producerID: e.id, send: id, frame: append([]byte(nil), f.Bytes()...)}
		return tok, nil
	}
	d := r.chunks.t.Offer(ch)
	r.chunks.decisions.WithLabelValues(d.Rule.String()).Inc()
	switch d.Action {
	case chunkdedup.Forward:
		r.inflightTok[tok] = e.id
		return 0, e.p.SendTagged(now, f, s, uint64(tok), &r.out)
	case chunkdedup.AnswerNow:
		r.log.Info("duplicate chunk answered with its stored copy", "topic", e.topic, "producer", e.name,
			"sequence_id", s.SequenceID, "chunk_id", md.GetChunkId(), "ledger", d.Ledger, "entry", d.Entry)
		id, err := e.p.Hold(now, s, &r.out)
		if err == nil {
			e.p.Resolve(id, d.Ledger, d.Entry, &r.out)
		}
		return 0, err
	case chunkdedup.AnswerWhenPersisted:
		r.log.Info("duplicate chunk held until its original is stored", "topic", e.topic, "producer", e.name,
			"sequence_id", s.SequenceID, "chunk_id", md.GetChunkId())
		id, err := e.p.Hold(now, s, &r.out)
		if err != nil {
			r.chunks.t.Cancel(tok)
			return 0, err
		}
		r.waiting[tok] = waitRef{producerID: e.id, send: id, frame: append([]byte(nil), f.Bytes()...)}
		return tok, nil
	default: // Reject
		id, err := e.p.Hold(now, s, &r.out)
		if err == nil {
			e.p.Fail(id, pulsarpb.ServerError_PersistenceError, "duplicate chunk: too many copies waiting; resend later", &r.out)
		}
		r.chunks.t.Cancel(tok)
		return 0, err
	}
}

// onTagged is every engine's OnTagged: a forwarded chunk's fate, processed after the engine
// call returns.
func (r *rebatchPath) onTagged(tag, ledger, entry uint64, failed bool) {
	r.events = append(r.events, tagEvent{tok: chunkdedup.Token(tag), ledger: ledger, entry: entry, failed: failed})
}

// processEvents reports forwarded chunks' fates to the tracker and delivers what follows to
// the held copies, here or, through the mailbox, on other connections.
func (r *rebatchPath) processEvents() {
	for len(r.events) > 0 {
		ev := r.events[0]
		r.events = r.events[1:]
		delete(r.inflightTok, ev.tok)
		if !ev.failed {
			for _, a := range r.chunks.t.Persisted(ev.tok, ev.ledger, ev.entry) {
				r.deliver(a.Token, chunkEvent{ledger: a.Ledger, entry: a.Entry})
			}
			continue
		}
		if promoted, ok := r.chunks.t.Failed(ev.tok); ok {
			r.deliver(promoted, chunkEvent{promote: true})
		}
	}
}

func (r *rebatchPath) deliver(tok chunkdedup.Token, ev chunkEvent) {
	if _, ok := r.waiting[tok]; ok {
		r.applyEvent(tok, ev)
		return
	}
	r.chunks.post(tok, ev)
}

// applyEvent records the fate of a duplicate held here; the held chunk is settled (answered,
// or forwarded because its original failed) when it reaches the head of its producer's queue,
// so held chunks promoted together still reach the broker in the order the client sent them.
func (r *rebatchPath) applyEvent(tok chunkdedup.Token, ev chunkEvent) {
	w, ok := r.waiting[tok]
	if !ok {
		return
	}
	r.deadlineStale = true // the held chunk's engine (and those queued behind it) move on
	q := r.queued[w.producerID]
	for i := range q {
		if q[i].waiting && q[i].tok == tok {
			q[i].settled, q[i].ev = true, ev
			r.releaseQueued(w.producerID)
			return
		}
	}
	r.settle(tok, ev)
}

// settle answers a held duplicate, or forwards it because its original failed.
func (r *rebatchPath) settle(tok chunkdedup.Token, ev chunkEvent) {
	w, ok := r.waiting[tok]
	if !ok {
		return
	}
	delete(r.waiting, tok)
	e := r.producers[w.producerID]
	if e == nil {
		if ev.promote {
			// Nobody here can forward it any more: let the next copy go.
			r.events = append(r.events, tagEvent{tok: tok, failed: true})
		}
		return
	}
	if !ev.promote {
		e.p.Resolve(w.send, ev.ledger, ev.entry, &r.out)
		return
	}
	f, _, err := wire.ReadFrame(w.frame, len(w.frame))
	if err == nil {
		err = e.p.Promote(w.send, f, uint64(tok), &r.out)
	}
	if err != nil {
		r.events = append(r.events, tagEvent{tok: tok, failed: true})
		return
	}
	r.inflightTok[tok] = e.id
}

// deferFrame queues a copy of a client frame of producer e (a SEND, chunk or not, or its
// CLOSE_PRODUCER) behind a duplicate chunk of the same producer that is held for its
// original's fate: the frame is handled, in the client's order, once everything before it is
// settled, so receipts keep that order and a held copy forwarded after all still reaches the
// broker before what the client sent after it. It reports false, and the caller handles the
// SEND at once, when the copies would exceed maxQueuedBytes.
func (r *rebatchPath) deferFrame(e *engine, f wire.Frame) bool {
	if f.Type() == pulsarpb.BaseCommand_SEND && r.queuedBytes+f.Len() > maxQueuedBytes {
		r.log.Warn("sends queued behind held duplicate chunks exceed their bound; sending at once", "topic", e.topic,
			"producer", e.name, "queued_bytes", r.queuedBytes, "limit", maxQueuedBytes)
		return false
	}
	r.queued[e.id] = append(r.queued[e.id], queuedSend{frame: append([]byte(nil), f.Bytes()...)})
	r.queuedBytes += f.Len()
	return true
}

// releaseQueued works through producer id's queue from its head, in order: settled held
// chunks are settled and queued frames handled (output in r.out), up to the first held chunk
// whose original's fate is still unknown, which may be one of the queued chunks, held now.
func (r *rebatchPath) releaseQueued(id uint64) {
	q := r.queued[id]
	for len(q) > 0 {
		it := q[0]
		if it.waiting {
			if !it.settled {
				break
			}
			q = q[1:]
			r.settle(it.tok, it.ev)
			continue
		}
		q = q[1:]
		r.queuedBytes -= len(it.frame)
		e := r.producers[id]
		f, _, err := wire.ReadFrame(it.frame, len(it.frame))
		if e == nil || err != nil {
			continue
		}
		var tok chunkdedup.Token
		if f.Type() == pulsarpb.BaseCommand_CLOSE_PRODUCER {
			err = r.closeProducer(id)
			r.out.Broker = append(r.out.Broker, f.Bytes()...)
		} else if s, perr := wire.ParseSend(f); perr != nil {
			err = perr
		} else if s.IsChunk && r.chunks != nil {
			tok, err = r.sendChunk(e, f, &s)
		} else {
			err = e.p.SendParsed(r.info.Now(), &f, &s, &r.out)
		}
		if err != nil && r.deferErr == nil {
			r.deferErr = fmt.Errorf("producer %d (%q) on %s: %w", id, e.name, e.topic, err)
		}
		if tok != 0 {
			// Held now: what follows waits behind it.
			q = append([]queuedSend{{tok: tok, waiting: true}}, q...)
			break
		}
	}
	if len(q) == 0 {
		delete(r.queued, id)
	} else {
		r.queued[id] = q
	}
	if e := r.producers[id]; e != nil {
		r.noteBacklog(e)
	}
}

// processNonce tells this proxy process's shared producers apart from another's on the same
// broker.
var processNonce = strconv.FormatInt(time.Now().UnixNano()%1e9, 36)

// sharedMember returns another engine writing through the shared lane with producer id lid.
func (r *rebatchPath) sharedMember(lid uint64) *engine {
	for id, e := range r.producers {
		if id == e.id && !e.p.Abandoned() && e.p.OwnsProducer(lid) {
			return e
		}
	}
	return nil
}

// closeShared closes the broker producer of a shared lane nobody uses any more.
func (r *rebatchPath) closeShared(lid uint64) {
	for topic, sl := range r.shared {
		if sl.ProducerID() != lid {
			continue
		}
		delete(r.shared, topic)
		req := r.newID()
		b, err := wire.AppendCommandFrame(nil, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_CLOSE_PRODUCER.Enum(),
			CloseProducer: &pulsarpb.CommandCloseProducer{ProducerId: proto.Uint64(lid), RequestId: proto.Uint64(req)}})
		if err == nil {
			r.swallow[req] = struct{}{}
			r.out.Broker = append(r.out.Broker, b...)
		}
	}
}
