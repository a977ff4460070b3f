package rebatch

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/rebatchproxy/rebatchproxy/route"
	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/batch"
	"github.com/rebatchproxy/rebatchproxy/wire/compression"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// Sentinel errors. Each one means the connection should be closed with a logged reason: the
// engine's state no longer matches what the client or the broker believes.
var (
	// ErrWrongProducer: a SEND for another producer id was given to this engine.
	ErrWrongProducer = errors.New("rebatch: send for another producer")
	// ErrTooManyPending: the client has more sends awaiting receipts than the configured bound.
	ErrTooManyPending = errors.New("rebatch: too many sends pending")
	// ErrUnexpectedReceipt: the broker acknowledged something other than the oldest entry in flight.
	ErrUnexpectedReceipt = errors.New("rebatch: receipt does not match the oldest entry in flight")
	// ErrMalformedSend: a client SEND whose metadata or batch payload does not parse.
	ErrMalformedSend = errors.New("rebatch: malformed send")
	// ErrLaneClosed: the broker closed one of the bucket producers; the client must reconnect
	// and resend, which closing its connection makes it do.
	ErrLaneClosed = errors.New("rebatch: the broker closed a bucket producer")

	// errTooBig: a send the engine cannot rebuild within the entry budget; forwarded as is.
	errTooBig = errors.New("rebatch: send larger than an entry")
)

// Config describes one client producer as the broker registered it.
type Config struct {
	Policy Policy // validated
	// ProducerID is the client's producer id; the broker producer is the client's own, so the
	// same id is used on both sides.
	ProducerID   uint64
	ProducerName string
	// MaxMessageSize is the broker's max_message_size from CONNECTED (5 MiB when absent).
	MaxMessageSize int
	// LastSequenceID is CommandProducerSuccess.last_sequence_id: with broker de-duplication
	// on, the highest sequence id the broker persisted for this producer name; -1 otherwise.
	LastSequenceID int64
	// MaxPendingSends bounds the client sends awaiting receipts (contract 7); 0 means 100,000
	// (4M for TrackOnly). Beyond it Send returns ErrTooManyPending and the connection closes.
	MaxPendingSends int
	// OnEntry, when set, is called with the message count of every entry sent to the broker.
	OnEntry func(messages int)
	// OnReceipt, when set, is called with the time Send received a client send whose receipt
	// is being released.
	OnReceipt func(sentAt time.Time)
	// OnTagged, when set, learns the fate of every send forwarded by SendTagged: its
	// receipt's position, or failed when the broker refused it.
	OnTagged func(tag, ledger, entry uint64, failed bool)
	// TrackOnly makes an engine for a passthrough producer: every send is forwarded
	// unchanged (the metadata is not even decoded); the engine only keeps the client's receipt
	// order, so sends answered by the proxy (duplicate chunks) can be slotted in.
	TrackOnly bool
	// Adopt is the number of sends the client had in flight before the engine existed; their
	// receipts are relayed first, whatever their sequence ids.
	Adopt int
	// Shared is the lane of coalesce with merge_producers: every client producer of one topic
	// on the connection writes through it.
	Shared *SharedLane
}

// Output collects what one engine call produced: frames for the broker and frames for the
// client, each appended in the order they must be written. The caller writes them and resets
// the slices (keeping their capacity) before the next call.
type Output struct {
	Broker []byte
	Client []byte
}

// Stats are cumulative counters of one engine.
type Stats struct {
	ClientSends      uint64
	ClientMessages   uint64
	EntriesBuilt     uint64
	EntriesVerbatim  uint64
	FlushMaxMessages uint64
	FlushMaxBytes    uint64
	FlushDelay       uint64
	FlushGroup       uint64 // properties changed, schema changed, a resend, or a send never merged
	FlushKeys        uint64 // the next message's Key_Shared routing differs (Policy.KeysApart)
	FlushExplicit    uint64
	FlushIdle        uint64 // sent at once because nothing of its lane was in flight
	ReceiptsToClient uint64
	ErrorsToClient   uint64
	// SendsUnsplittable counts sends forwarded as the client built them because the policy
	// would cut them into more pieces than their sequence ids can number (numbering.go).
	SendsUnsplittable uint64
	// SendsOutOfOrder counts sends whose command id is at or below one the engine already
	// sent; they are forwarded unchanged for the broker to judge, as it would directly.
	SendsOutOfOrder uint64
	// SendsAlone counts coalesce sends forwarded as the client built them because the entry
	// they would become holds them alone and leaves at once (alone).
	SendsAlone uint64
	// SendsHeldForMark counts out-of-order sends held until the broker could judge them
	// (outoforder.go).
	SendsHeldForMark uint64
	// PiecesStraddlingMark counts pieces of resent sends that the earlier attempt had cut
	// differently (another policy or budget); they are sent as duplicates.
	PiecesStraddlingMark uint64
}

// clientSend is one CommandSend of the client awaiting its receipt.
type clientSend struct {
	sentAt     time.Time
	placed     bool   // its first message is in an open batch or an entry
	adopted    bool   // sent before the engine existed: seq and highest come from its receipt
	seq        uint64 // CommandSend.sequence_id, echoed verbatim
	highest    uint64 // CommandSend.highest_sequence_id, echoed when the client set it
	unflushed  int    // messages of this send still in open batches
	parts      int    // entries holding this send's messages, sent and not yet acknowledged
	hasID      bool
	ledger     uint64
	entry      uint64
	failed     bool
	errCode    pulsarpb.ServerError
	errMessage string
}

// inflight is one entry sent to the broker and not yet acknowledged, with the client sends
// that have messages in it.
type inflight struct {
	lo, hi  uint64
	adopted bool // matches any receipt: a send from before the engine existed
	// The client sends with messages in the entry: one (the common case, kept inline so a
	// verbatim or single-send entry costs no allocation), or more.
	one  sendRef
	more []sendRef
	tag  uint64 // non-zero for a tagged verbatim send (a tracked chunk), see SendTagged
}

// msgRef is one message of the send being taken apart; slices alias the client's frame or the
// engine's decompression buffer. meta is smm parsed, once (by the batch iterator, or from the
// send's metadata for a message sent alone): routing, grouping and the entry's outer key read
// it, never smm again.
type msgRef struct {
	smm     []byte
	meta    batch.SingleMeta
	payload []byte
	seq     uint64
}

// sendRef names one client send of one engine (a shared lane carries several engines' sends).
type sendRef struct {
	p     *Producer
	id    uint64
	first bool // the entry holds the send's first message: its position is the receipt's
}

// sendCount is how many messages of one client send an open batch holds.
type sendCount struct {
	sendRef
	n int
}

// openBatch is the batch being filled in one lane.
type openBatch struct {
	n                 int
	buf               []byte // uncompressed batch payload
	lo, hi            uint64
	sends             []sendCount
	dup               bool   // holds only messages at or below the lane's de-duplication mark
	group             []byte // routing class and restricted properties (classify)
	routeLen          int    // length of group's routing class, as the opening engine built it
	schema            []byte
	hasSchema         bool
	compression       pulsarpb.CompressionType
	publishTime       uint64
	hasPublishTime    bool
	key               []byte // first (keyed) message's key, copied to the outer metadata; under buckets the first message's routing key
	keyB64, isOrdKey  bool
	partitionKeyFirst bool
	hasKey            bool
	hashLo, hashHi    uint16 // buckets: hashB range of the keyed messages
	hasHash           bool
	started           time.Time
	first             *Producer // the engine whose send opened the batch (its entry fields apply)
}

// lane is one broker producer and its open batch. Lane 0 is the client's own producer; the
// buckets policy adds one lane per bucket, each a broker producer the engine creates.
type lane struct {
	producerID uint64
	name       string
	// maxDelay is how long a batch may stay open: the policy's for the engine's own lanes, the
	// shortest of its members' for a shared lane (a reload may give members of one topic
	// different ones), so that any member's Deadline and Tick agree on it.
	maxDelay time.Duration
	open     openBatch
	entries  []inflight // in flight, oldest first; see push and pop
	base     []inflight // the array entries lives in, from its start, reused once empty
	// lastPushed is this producer's de-duplication mark as the broker will have it once it has
	// judged everything sent (see pushed); on a shared lane, the highest id sent.
	lastPushed int64
	// persisted is the highest id the broker has stored for this producer, as far as its
	// receipts tell (MessageDeduplication's highestSequencedPersisted). Between it and
	// lastPushed the broker "cannot determine" whether a send is a duplicate.
	persisted int64
	// waiting: frames held until the broker can judge an out-of-order send (outoforder.go).
	waiting   []heldFrame
	requestID uint64 // outstanding PRODUCER request (bucket and shared lanes)
	ready     bool
	// shared: a lane several client producers write through (coalesce with merge_producers):
	// a proxy-owned producer whose entries carry the proxy's own sequence ids.
	shared  bool
	seqNext uint64
}

// Producer is the engine for one client producer under a rewriting policy (coalesce,
// properties or buckets). It is a pure state machine: it never does I/O and takes time from
// its caller.
//
// A Producer belongs to the goroutine that owns the client's connection (its event loop); no
// method may be called concurrently.
type Producer struct {
	cfg      Config
	restrict restriction
	budget   int // maximum uncompressed payload bytes per entry
	lanes    []*lane
	ring     *route.Buckets
	// dead engines (their producer was closed by the broker) release nothing: the client
	// re-creates the producer under the same id and resends.
	dead bool

	// sends[sendHead+i] is client send number sendBase+i; sends[:sendHead] are retired.
	sends    []clientSend
	sendHead int
	sendBase uint64

	stats Stats

	// Scratch, reused across calls so the steady state does not allocate per frame.
	meta      wire.SendMetadata  // the send being taken (Send), scanned once
	outMeta   wire.EntryMetadata // the entry being built (flush)
	outProps  []wire.Property
	freeRefs  [][]sendRef // see refSlice
	msgs      []msgRef
	unzip     []byte
	single    []byte
	numbered  []byte // explode's SingleMessageMetadata of messages given their batch's id
	zipped    []byte
	groupKV   []byte
	groupVals [][]byte
	// groupRaw is the encoded properties groupKV was derived from. Both start empty: no
	// properties, the empty group.
	groupRaw []byte
	fallback []byte // routeOf's Pulsar 4 fallback key
	keyBuf   []byte // routeOf's decoded partition key
	plan     []planned
	pieces   []piece
	arena    []byte
	current  []int
	// ownMark is the highest sequence id this engine has sent, or placed in an open batch, as
	// new on its own broker producers (-1: none yet); a client send at or below it is out of
	// order, not a resend.
	ownMark int64
	// heldBytes is the size of the frames the lanes hold (lane.waiting).
	heldBytes int
	// atomic: the send being taken apart numbers its batch as one sequence id (no per-message
	// ids); mixedSeq: some of its messages have ids and some do not.
	atomic, mixedSeq bool
}

// NewProducer returns the engine for one client producer. Under the buckets policy the engine
// is not ready until OpenLanes and LaneOpened have created its bucket producers.
func NewProducer(cfg Config) (*Producer, error) {
	if cfg.TrackOnly {
		cfg.Policy = Policy{Kind: Passthrough}
	} else if err := cfg.Policy.Validate(); err != nil {
		return nil, err
	} else if cfg.Policy.Kind == Passthrough {
		return nil, fmt.Errorf("%w: passthrough producers use the engine only to track receipts (TrackOnly)", ErrInvalidPolicy)
	}
	if cfg.MaxMessageSize <= 0 {
		cfg.MaxMessageSize = 5 << 20
	}
	if cfg.MaxPendingSends <= 0 {
		cfg.MaxPendingSends = 100000
		if cfg.TrackOnly {
			// A passthrough producer is bounded by the client and the broker; the engine only
			// keeps order and must not be what disconnects it.
			cfg.MaxPendingSends = 1 << 22
		}
	}
	p := &Producer{cfg: cfg, ownMark: -1}
	p.lanes = []*lane{{producerID: cfg.ProducerID, name: cfg.ProducerName, maxDelay: cfg.Policy.MaxDelay, lastPushed: cfg.LastSequenceID, persisted: cfg.LastSequenceID, ready: true}}
	switch cfg.Policy.Kind {
	case Properties:
		p.restrict = compileRestriction(cfg.Policy.Restricted)
	case Coalesce:
		if sl := cfg.Shared; sl != nil {
			if sl.l.maxDelay == 0 || cfg.Policy.MaxDelay < sl.l.maxDelay {
				sl.l.maxDelay = cfg.Policy.MaxDelay
			}
			p.lanes = append(p.lanes, sl.l)
		}
	case Buckets:
		p.ring = cfg.Policy.Ring()
		for i := 0; i < p.ring.Len(); i++ {
			p.lanes = append(p.lanes, &lane{name: LaneName(cfg.ProducerName, i), maxDelay: cfg.Policy.MaxDelay, lastPushed: -1, persisted: -1})
		}
	}
	// Outer metadata of a built entry stays well under 8 KiB; the broker refuses an entry whose
	// metadata and payload exceed max_message_size.
	p.budget = min(cfg.Policy.MaxBytes, cfg.MaxMessageSize-8<<10)
	if p.budget < 1<<10 {
		p.budget = 1 << 10
	}
	for i := 0; i < cfg.Adopt; i++ {
		p.sends = append(p.sends, clientSend{adopted: true, parts: 1})
		p.lanes[0].push(inflight{adopted: true, one: sendRef{p, uint64(i), true}})
	}
	return p, nil
}

// push appends an entry in flight. When the array grows, base follows it.
func (l *lane) push(e inflight) {
	c := cap(l.entries)
	l.entries = append(l.entries, e)
	if cap(l.entries) != c {
		l.base = l.entries
	}
}

// pop retires the oldest entry in flight; once none is left the array is reused from its
// start, so steady traffic does not allocate.
func (l *lane) pop() inflight {
	e := l.entries[0]
	l.entries = l.entries[1:]
	if len(l.entries) == 0 {
		l.entries = l.base[:0]
	}
	return e
}

// take removes and returns the entry in flight a broker answer is for: the oldest one (which
// an entry adopted from before the engine matches whatever its ids), else the oldest that
// match accepts. The broker answers in order except when de-duplication answers at once: a
// duplicate's receipt (-1:-1) and the "cannot determine" error overtake the entries ahead of
// them, which an out-of-order send makes happen on a live producer.
func (l *lane) take(match func(*inflight) bool) (inflight, bool) {
	if l.entries[0].adopted || match(&l.entries[0]) {
		return l.pop(), true
	}
	for i := 1; i < len(l.entries); i++ {
		if !l.entries[i].adopted && match(&l.entries[i]) {
			e := l.entries[i]
			copy(l.entries[i:], l.entries[i+1:])
			l.entries = l.entries[:len(l.entries)-1]
			return e, true
		}
	}
	return inflight{}, false
}

// LaneName is the broker producer name of bucket i of a client producer. It is derived from
// the client's producer name alone, so a client that reconnects (to this proxy process or
// another) gets the same bucket producers and their de-duplication state.
func LaneName(clientProducer string, bucket int) string {
	return fmt.Sprintf("%s-bucket-%d", clientProducer, bucket)
}

// Stats returns the engine's counters.
func (p *Producer) Stats() Stats { return p.stats }

// Pending returns the number of client sends awaiting their receipt.
func (p *Producer) Pending() int { return len(p.sends) - p.sendHead }

// MaxPending returns the bound on Pending (Config.MaxPendingSends after
// defaults): a Send beyond it fails with ErrTooManyPending.
func (p *Producer) MaxPending() int { return p.cfg.MaxPendingSends }

// send returns client send number id, which must be pending.
func (p *Producer) send(id uint64) *clientSend { return &p.sends[p.sendHead+int(id-p.sendBase)] }

// popSend retires the oldest pending send. The queue's array is reused from its start once
// empty, so a steady stream of sends and receipts does not allocate.
func (p *Producer) popSend() {
	p.sendHead++
	p.sendBase++
	if p.sendHead == len(p.sends) {
		p.sends, p.sendHead = p.sends[:0], 0
	}
}

// Deadline returns when the earliest open batch must be flushed by Tick, if one is open.
func (p *Producer) Deadline() (time.Time, bool) {
	var d time.Time
	ok := false
	for i := range p.lanes {
		if o := &p.lanes[i].open; o.n > 0 {
			t := o.started.Add(p.lanes[i].maxDelay)
			if !ok || t.Before(d) {
				d, ok = t, true
			}
		}
	}
	return d, ok
}

// Tick flushes every open batch whose delay has expired.
func (p *Producer) Tick(now time.Time, out *Output) error {
	for i := range p.lanes {
		l := p.lanes[i]
		if l.open.n > 0 && !now.Before(l.open.started.Add(l.maxDelay)) {
			p.stats.FlushDelay++
			if err := p.flush(l, out); err != nil {
				return err
			}
		}
	}
	return nil
}

// Flush sends every open batch now (for example before the producer closes).
func (p *Producer) Flush(out *Output) error {
	for i := range p.lanes {
		if p.lanes[i].open.n > 0 {
			p.stats.FlushExplicit++
			if err := p.flush(p.lanes[i], out); err != nil {
				return err
			}
		}
		// What the lane holds goes too, ahead of whatever the caller writes next (the client's
		// CLOSE_PRODUCER), as on a direct connection.
		p.releaseWaiting(p.lanes[i], true, out)
	}
	return nil
}

func (p *Producer) flushAll(out *Output) error {
	for i := range p.lanes {
		if p.lanes[i].open.n > 0 {
			p.stats.FlushGroup++
			if err := p.flush(p.lanes[i], out); err != nil {
				return err
			}
		}
	}
	return nil
}

// admit reads a client SEND and checks it may join the engine: this producer's, within
// MaxPendingSends.
func (p *Producer) admit(s *wire.Send) error {
	switch {
	case s.ProducerID != p.cfg.ProducerID:
		return ErrWrongProducer
	case p.Pending() >= p.cfg.MaxPendingSends:
		return ErrTooManyPending
	}
	return nil
}

// Send takes one client SEND frame of this producer.
func (p *Producer) Send(now time.Time, f wire.Frame, out *Output) error {
	var s wire.Send
	if err := wire.ParseSendInto(f, &s); err != nil {
		return err
	}
	return p.SendParsed(now, &f, &s, out)
}

// SendParsed is Send for a caller that has already parsed the frame's CommandSend into s (the
// proxy, to find the producer): the command is not read again.
func (p *Producer) SendParsed(now time.Time, f *wire.Frame, s *wire.Send, out *Output) error {
	if err := p.admit(s); err != nil {
		return err
	}
	if !f.HasPayload() {
		return ErrMalformedSend
	}
	if p.cfg.TrackOnly {
		p.stats.ClientSends++
		return p.verbatim(now, f, s, out)
	}
	if err := wire.ParseSendMetadata(f.Metadata(), &p.meta); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformedSend, err)
	}
	p.stats.ClientSends++
	// A send whose checksum fails is the broker's to refuse (ChecksumError), exactly as on a
	// direct connection; rebuilding it would launder corrupt data into a valid entry.
	if neverMerged(s, &p.meta) || !f.HasChecksum() || f.VerifyChecksum() != nil {
		return p.verbatim(now, f, s, out)
	}
	if p.alone(s) {
		// The entry this send would become holds it alone and leaves at once: the client's own
		// frame is that entry (unbatched), so a workload coalescing cannot merge costs what
		// passthrough costs.
		p.stats.ClientMessages++
		p.stats.SendsAlone++
		return p.verbatim(now, f, s, out)
	}
	msgs, err := p.explode(f, s)
	if err == errTooBig {
		return p.verbatim(now, f, s, out)
	}
	if err != nil {
		return err
	}
	for i := range msgs {
		if m := &msgs[i]; 4+len(m.smm)+len(m.payload) > p.budget {
			return p.verbatim(now, f, s, out) // a message no built entry could hold
		}
	}
	p.stats.ClientMessages += uint64(len(msgs))
	if len(p.lanes) > 1 && p.lanes[1].shared {
		return p.sendShared(now, s, msgs, out)
	}
	num := numberingOf(s.SequenceID, s.HighestSequenceID, msgs, p.atomic, p.mixedSeq)
	if int64(s.SequenceID) <= p.ownMark {
		// Below what this engine already sent, so not a resend (numbering.go): the broker judges
		// it as the client built it, against the mark its ids were compared with directly.
		p.stats.SendsOutOfOrder++
		return p.outOfOrder(now, f, s, out)
	}
	if p.ring == nil && int64(num.hi) <= p.lanes[0].lastPushed {
		// A resend of something the broker holds whole: the broker answers it itself.
		return p.verbatim(now, f, s, out)
	}
	if !p.planSend(msgs, num) {
		p.stats.SendsUnsplittable++
		return p.verbatim(now, f, s, out)
	}
	id := p.sendBase + uint64(p.Pending())
	p.sends = append(p.sends, clientSend{sentAt: now, seq: s.SequenceID, highest: s.HighestSequenceID})
	for i := range msgs {
		m, pm := &msgs[i], &p.plan[i]
		l := p.lanes[pm.lane]
		lo, hi := m.seq, m.seq
		need, count := 4+len(m.smm)+len(m.payload), 1
		if !num.perMessage {
			pc := &p.pieces[pm.piece]
			lo, hi = pc.lo, pc.hi
			need, count = pc.bytes, pc.count
		}
		// Ids at or below the lane's mark are a resend of what the broker may already hold (a
		// send this proxy had cut, part of which was stored when a connection or the proxy
		// died). They go in entries of duplicates only, so the broker drops them without
		// taking new messages with it. A span piece straddling the mark was cut differently
		// before (another policy or budget): the broker will refuse its first id, so it is
		// kept apart with the duplicates.
		dup := int64(hi) <= l.lastPushed
		if !dup && int64(lo) <= l.lastPushed {
			dup = true
			p.stats.PiecesStraddlingMark++
		}
		if num.perMessage || pm.start {
			if err := p.makeRoom(l, dup, p.arena[pm.groupLo:pm.group], need, count, out); err != nil {
				return err
			}
		}
		// A span piece fits whole (checked at its start), so a full batch ends with a piece.
		if err := p.place(now, l, id, m, pm, dup, lo, hi, out); err != nil {
			return err
		}
	}
	return p.flushReady(out)
}

// sendShared places a send's messages in the shared lane of coalesce with merge_producers,
// whose entries carry the proxy's own sequence ids: the client's numbering does not matter.
func (p *Producer) sendShared(now time.Time, s *wire.Send, msgs []msgRef, out *Output) error {
	l := p.lanes[1]
	id := p.sendBase + uint64(p.Pending())
	p.sends = append(p.sends, clientSend{sentAt: now, seq: s.SequenceID, highest: s.HighestSequenceID})
	for i := range msgs {
		m := &msgs[i]
		p.arena = p.arena[:0]
		var pm planned
		p.classify(m, &pm)
		if err := p.makeRoom(l, false, p.arena[pm.groupLo:pm.group], 4+len(m.smm)+len(m.payload), 1, out); err != nil {
			return err
		}
		if err := p.place(now, l, id, m, &pm, false, 0, 0, out); err != nil {
			return err
		}
	}
	return p.flushReady(out)
}

// makeRoom flushes a lane's open batch unless need more bytes and count more messages of this
// kind (duplicates or not, entry fields, property group) may join it.
func (p *Producer) makeRoom(l *lane, dup bool, group []byte, need, count int, out *Output) error {
	o := &l.open
	if o.n == 0 {
		return nil
	}
	switch {
	case o.dup != dup, !p.sameEntryFields(o):
		p.stats.FlushGroup++
	case !bytes.Equal(group, o.group):
		if p.sameRoute(group, o) {
			p.stats.FlushGroup++
		} else {
			p.stats.FlushKeys++
		}
	case len(o.buf)+need > p.budget:
		p.stats.FlushMaxBytes++
	case o.n+count > p.cfg.Policy.MaxMessages:
		p.stats.FlushMaxMessages++
	default:
		return nil
	}
	return p.flush(l, out)
}

// place adds a message to a lane's open batch and sends the batch once it is full.
func (p *Producer) place(now time.Time, l *lane, id uint64, m *msgRef, pm *planned, dup bool, lo, hi uint64, out *Output) error {
	p.add(now, l, id, m, pm, dup, lo, hi)
	if l.open.n < p.cfg.Policy.MaxMessages {
		return nil
	}
	p.stats.FlushMaxMessages++
	return p.flush(l, out)
}

// flushReady sends the open batches that must not wait: duplicates never wait for company, and
// an idle lane does not wait at all (group commit).
func (p *Producer) flushReady(out *Output) error {
	for _, l := range p.lanes {
		switch {
		case l.open.n == 0:
		case l.open.dup:
			p.stats.FlushGroup++
		case len(l.entries) == 0 && !p.cfg.Policy.HoldWhenIdle:
			p.stats.FlushIdle++
		default:
			continue
		}
		if err := p.flush(l, out); err != nil {
			return err
		}
	}
	return nil
}

// flushIdle sends a lane's open batch when its last entry in flight was just acknowledged.
func (p *Producer) flushIdle(l *lane, out *Output) {
	if l.open.n > 0 && len(l.entries) == 0 && !p.cfg.Policy.HoldWhenIdle && l.ready {
		p.stats.FlushIdle++
		_ = p.flush(l, out) // a flush error is an encoding bug; the batch stays open for Tick
	}
}

// alone reports whether a coalesce send would be built into an entry of its one message and
// sent at once: an unbatched message on the client's own producer with nothing open or in
// flight there (an idle lane sends at once, flushReady), new (above every mark), with no codec
// for the policy to apply. (Under properties and buckets the built entry's outer metadata would
// differ: stamped properties, a bucket producer.)
func (p *Producer) alone(s *wire.Send) bool {
	l := p.lanes[0]
	return p.cfg.Policy.Kind == Coalesce && len(p.lanes) == 1 && !p.cfg.Policy.HoldWhenIdle && p.cfg.Policy.Compression == nil &&
		!p.meta.Batched && s.NumMessages <= 1 && l.ready && l.open.n == 0 && len(l.entries) == 0 && len(l.waiting) == 0 &&
		int64(s.SequenceID) > p.ownMark && int64(s.SequenceID) > l.lastPushed && s.HighestSequenceID <= s.SequenceID
}

// neverMerged reports whether a send must be forwarded alone and unchanged (DESIGN.md
// section 2): chunks, markers, transactions, encrypted payloads, delayed delivery and
// replication, whose meaning is tied to the entry as the client built it, and sends with a
// command or metadata field an entry built here would not carry.
func neverMerged(s *wire.Send, md *wire.SendMetadata) bool {
	return s.IsChunk || s.Marker || s.HasTxnID || s.MessageID != nil || s.Unmodeled || md.Special
}

// explode takes a send apart into messages, each with an encoded SingleMessageMetadata.
func (p *Producer) explode(f *wire.Frame, s *wire.Send) ([]msgRef, error) {
	md := &p.meta
	payload := f.Payload()
	if c := md.Compression; c != pulsarpb.CompressionType_NONE {
		if int(md.UncompressedSize) > p.budget {
			// Compressed below the broker's limit but larger than an entry may be once
			// uncompressed: only the client's own compression makes it fit.
			return nil, errTooBig
		}
		var err error
		p.unzip, err = compression.Decompress(p.unzip[:0], c, payload, int(md.UncompressedSize), p.budget)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrMalformedSend, err)
		}
		payload = p.unzip
	}
	p.msgs = p.msgs[:0]
	p.atomic, p.mixedSeq = false, false
	if !md.Batched {
		// A message sent alone: its own fields move from the outer metadata into a
		// SingleMessageMetadata, where a batch keeps them.
		p.single = md.AppendSingleMetadata(p.single[:0], len(payload))
		// Filled in place, field by field: a msgRef literal would zero its 144-byte view
		// only for FillSingleMeta to write it again.
		p.msgs = slices.Grow(p.msgs, 1)[:1]
		m := &p.msgs[0]
		m.smm, m.payload, m.seq = p.single, payload, s.SequenceID
		md.FillSingleMeta(&m.meta, p.single, len(payload))
		return p.msgs, nil
	}
	n := int(md.NumMessagesInBatch)
	it := batch.NewIterator(payload, n)
	p.atomic, p.mixedSeq = false, false
	for i := 0; it.Next(); i++ {
		m, meta := it.Message(), it.Meta()
		// Clients that number batches, not messages (pulsar-client-go before v0.10, pulsar-rs), leave
		// the messages' sequence ids unset: the whole batch is one id in their sequence space.
		seq := s.SequenceID
		if meta.HasSequenceID {
			seq = meta.SequenceID
			p.mixedSeq = p.mixedSeq || (i > 0 && p.atomic)
		} else {
			p.mixedSeq = p.mixedSeq || (i > 0 && !p.atomic)
			p.atomic = true
		}
		p.msgs = append(p.msgs, msgRef{smm: m.Metadata, meta: meta, payload: m.Payload, seq: seq})
	}
	if err := it.Err(); err != nil || len(p.msgs) == 0 {
		return nil, fmt.Errorf("%w: batch payload: %v", ErrMalformedSend, err)
	}
	if p.atomic {
		p.numberMessages()
	}
	return p.msgs, nil
}

// numberMessages gives each message of a batch numbered as one (no sequence id of its own) its
// batch's id in its own metadata. A consumer reads the entry's outer sequence_id for a message
// without one: directly that is its batch's, but in an entry built here it is the entry's first
// send's, which need not be its own (contract 3).
func (p *Producer) numberMessages() {
	need := 0
	for i := range p.msgs {
		if !p.msgs[i].meta.HasSequenceID {
			need += len(p.msgs[i].smm) + batch.MaxSequenceIDLen
		}
	}
	if cap(p.numbered) < need {
		p.numbered = make([]byte, 0, need) // filled below without growing: the slices stay valid
	}
	buf := p.numbered[:0]
	for i := range p.msgs {
		m := &p.msgs[i]
		if m.meta.HasSequenceID {
			continue
		}
		start := len(buf)
		buf = batch.AppendWithSequenceID(buf, m.smm, m.seq)
		m.smm = buf[start:len(buf):len(buf)]
		m.meta.HasSequenceID, m.meta.SequenceID = true, m.seq
	}
	p.numbered = buf
}

// sameEntryFields reports whether the send in p.meta may share an entry with an open batch: the
// entry-level fields other than compression must match.
func (p *Producer) sameEntryFields(o *openBatch) bool {
	return o.hasSchema == p.meta.HasSchemaVersion && bytes.Equal(o.schema, p.meta.SchemaVersion)
}

// groupOf returns the encoded restricted properties of a message, from its parsed metadata:
// for each restricted key in sorted order whose value the policy admits, the key and value,
// length-prefixed. Under coalesce every message is in the nil group. The result aliases
// scratch space until the next call.
func (p *Producer) groupOf(meta *batch.SingleMeta) []byte {
	if p.cfg.Policy.Kind != Properties {
		return nil
	}
	// Consecutive messages mostly carry the same properties (a producer's runs): the same
	// encoded properties give the same group, so the last one's is kept.
	raw := meta.PropertiesRaw()
	if bytes.Equal(raw, p.groupRaw) {
		return p.groupKV
	}
	vals := p.groupVals[:0]
	for range p.restrict.keys {
		vals = append(vals, nil)
	}
	_ = meta.Properties(func(k, v []byte) bool {
		// The last occurrence of a key is the message's value, as the Java client (and broker
		// code, entry filters included, reading a property list into a map) and the Go client
		// read it; the C++ client, and Python on it, keep the first. No client API can send a
		// key twice, so only raw-protocol producers meet the difference.
		if i := p.restrict.index(k); i >= 0 {
			vals[i] = v
			if v == nil {
				vals[i] = []byte{}
			}
		}
		return true
	})
	p.groupVals = vals
	p.groupKV = p.groupKV[:0]
	for i, v := range vals {
		if v == nil || !p.restrict.admits(i, v) {
			continue
		}
		p.groupKV = binary.AppendUvarint(p.groupKV, uint64(i))
		p.groupKV = binary.AppendUvarint(p.groupKV, uint64(len(v)))
		p.groupKV = append(p.groupKV, v...)
	}
	p.groupRaw = append(p.groupRaw[:0], raw...)
	return p.groupKV
}

// add appends one message to a lane's open batch, opening it if needed.
// lo and hi are the ids the message lends the entry: its own, or its piece's (numbering.go).
func (p *Producer) add(now time.Time, l *lane, id uint64, m *msgRef, pm *planned, dup bool, lo, hi uint64) {
	o := &l.open
	group := p.arena[pm.groupLo:pm.group]
	if o.n == 0 {
		o.lo, o.started, o.dup = lo, now, dup
		o.first = p
		o.sends = o.sends[:0]
		o.group = append(o.group[:0], group...)
		o.routeLen = p.routeLen(group)
		o.hasSchema = p.meta.HasSchemaVersion
		o.schema = append(o.schema[:0], p.meta.SchemaVersion...)
		o.compression = p.meta.Compression
		if p.cfg.Policy.Compression != nil {
			o.compression = *p.cfg.Policy.Compression
		}
		o.publishTime, o.hasPublishTime = p.meta.PublishTime, p.meta.HasPublishTime
		o.key = o.key[:0]
		o.hasKey, o.isOrdKey, o.keyB64, o.partitionKeyFirst, o.hasHash = false, false, false, false, false
	}
	switch {
	case o.hasKey:
	case p.ring != nil:
		// Under buckets the outer key is the first message's routing key, which lies in the
		// entry's bucket like every other message's (routing.go).
		o.key, o.isOrdKey, o.hasKey = append(o.key[:0], p.arena[pm.keyLo:pm.keyHi]...), true, true
	default:
		// The outer key is the first keyed message's, as clients do for their batches; under
		// KeysApart every keyed message of the entry has the same sticky hash.
		switch meta := &m.meta; {
		case meta.HasOrderingKey:
			o.key, o.isOrdKey, o.hasKey = append(o.key, meta.OrderingKey...), true, true
		case meta.HasPartitionKey:
			o.key, o.partitionKeyFirst, o.keyB64, o.hasKey = append(o.key, meta.PartitionKey...), true, meta.PartitionKeyB64Encoded, true
		}
	}
	if pm.hasHash {
		if !o.hasHash {
			o.hashLo, o.hashHi, o.hasHash = pm.hash, pm.hash, true
		}
		o.hashLo, o.hashHi = min(o.hashLo, pm.hash), max(o.hashHi, pm.hash)
	}
	o.buf = binary.BigEndian.AppendUint32(o.buf, uint32(len(m.smm)))
	o.buf = append(o.buf, m.smm...)
	o.buf = append(o.buf, m.payload...)
	o.n++
	o.hi = hi
	if l.shared {
		// A shared lane is the proxy's own sequence space: one id per message, in lane order.
		o.lo, o.hi = l.seqNext-uint64(o.n-1), l.seqNext
		l.seqNext++
	}
	if !dup && !l.shared {
		p.ownMark = max(p.ownMark, int64(hi)) // it will be sent as new (see pushed)
	}
	cs := p.send(id)
	if k := len(o.sends); k > 0 && o.sends[k-1].id == id && o.sends[k-1].p == p {
		o.sends[k-1].n++
	} else {
		o.sends = append(o.sends, sendCount{sendRef: sendRef{p, id, !cs.placed}, n: 1})
	}
	cs.placed = true
	cs.unflushed++
}

// flush builds a lane's open batch into one entry in batch format and queues it for the
// broker.
func (p *Producer) flush(l *lane, out *Output) error {
	o := &l.open
	if o.n == 0 {
		return nil
	}
	md := &p.outMeta
	*md = wire.EntryMetadata{
		ProducerName: l.name, SequenceID: o.lo, HighestSequenceID: o.hi,
		PublishTime: o.publishTime, HasPublishTime: o.hasPublishTime,
		NumMessagesInBatch: int32(o.n),
		SchemaVersion:      o.schema, HasSchemaVersion: o.hasSchema,
	}
	switch {
	case o.isOrdKey:
		// Under buckets: the routing key, as the bytes hashB was computed from, in
		// ordering_key, which Key_Shared prefers and reads as bytes. An empty key stays present.
		md.OrderingKey, md.HasOrderingKey = o.key, true
	case o.partitionKeyFirst:
		md.PartitionKey, md.HasPartitionKey, md.PartitionKeyB64Encoded = o.key, true, o.keyB64
	}
	if o.hasHash {
		md.EntryHashMin, md.EntryHashMax, md.HasEntryHashRange = uint32(o.hashLo), uint32(o.hashHi), true
	}
	// The group's restricted key/values become the entry's outer properties (PIP-191).
	p.outProps = p.outProps[:0]
	for b := o.group[o.routeLen:]; len(b) > 0; {
		i, n := binary.Uvarint(b)
		b = b[n:]
		ln, n := binary.Uvarint(b)
		b = b[n:]
		p.outProps = append(p.outProps, wire.Property{Key: p.restrict.rawKeys[i], Value: b[:ln]})
		b = b[ln:]
	}
	md.Properties = p.outProps
	payload := o.buf
	codec := o.compression
	if codec != pulsarpb.CompressionType_NONE {
		var err error
		p.zipped, err = compression.Compress(p.zipped[:0], codec, o.buf)
		// Incompressible data can grow; the entry must stay under the broker's limit (the
		// uncompressed buffer is within the budget: Send forwards larger sends as they are).
		if err != nil || len(p.zipped) > p.budget {
			codec = pulsarpb.CompressionType_NONE
		} else {
			payload = p.zipped
		}
	}
	md.Compression = codec
	md.UncompressedSize = uint32(len(o.buf))
	send := wire.Send{ProducerID: l.producerID, SequenceID: o.lo, NumMessages: int32(o.n), HighestSequenceID: o.hi}
	start := len(out.Broker)
	out.Broker = wire.AppendEntrySendFrame(out.Broker, &send, md, payload)
	e := inflight{lo: o.lo, hi: o.hi, one: o.sends[0].sendRef}
	if len(o.sends) > 1 {
		e.more = p.refSlice(len(o.sends))
	}
	for i, sc := range o.sends {
		if e.more != nil {
			e.more[i] = sc.sendRef
		}
		cs := sc.p.send(sc.id)
		cs.parts++
		cs.unflushed -= sc.n
	}
	p.emitted(l, e, false, out, start)
	if l.shared {
		l.lastPushed = max(l.lastPushed, int64(o.hi))
	} else {
		p.pushed(l, o.lo, o.hi)
	}
	p.stats.EntriesBuilt++
	if p.cfg.OnEntry != nil {
		p.cfg.OnEntry(o.n)
	}
	o.n = 0
	o.buf = o.buf[:0]
	return nil
}

// verbatim forwards a client send unchanged on the client's own producer, after flushing the
// open batches so order holds.
func (p *Producer) verbatim(now time.Time, f *wire.Frame, s *wire.Send, out *Output) error {
	return p.verbatimOn(now, f, s, p.lanes[0], out)
}

// verbatimOn forwards a client send as the client built it on broker producer l: the frame's
// own bytes on the client's producer, re-addressed (same metadata and payload) on a bucket lane.
// A nil l means the lane with the highest mark once the open batches are sent (highestLane).
func (p *Producer) verbatimOn(now time.Time, f *wire.Frame, s *wire.Send, l *lane, out *Output) error {
	if err := p.flushAll(out); err != nil {
		return err
	}
	if l == nil {
		l = p.highestLane()
	}
	id := p.queueVerbatim(now, s)
	start := len(out.Broker)
	out.Broker = appendOnLane(out.Broker, f, s, l)
	p.sentVerbatim(l, id, s, false, out, start)
	return nil
}

// queueVerbatim queues a client send that goes to the broker as one entry and returns its id.
func (p *Producer) queueVerbatim(now time.Time, s *wire.Send) uint64 {
	id := p.sendBase + uint64(p.Pending())
	p.sends = append(p.sends, clientSend{sentAt: now, seq: s.SequenceID, highest: s.HighestSequenceID, parts: 1})
	return id
}

// appendOnLane appends a client's SEND as the client built it, addressed to broker producer l:
// the frame's own bytes on the client's producer, re-addressed (same metadata and payload) on a
// bucket lane.
func appendOnLane(dst []byte, f *wire.Frame, s *wire.Send, l *lane) []byte {
	if l.producerID == s.ProducerID {
		return append(dst, f.Bytes()...)
	}
	moved := *s
	moved.ProducerID = l.producerID
	return wire.AppendSendFrame(dst, &moved, f.Metadata(), f.Payload())
}

// sentVerbatim records client send id, just appended to out.Broker from start for l as the
// client built it, as in flight (or held: emitted).
func (p *Producer) sentVerbatim(l *lane, id uint64, s *wire.Send, check bool, out *Output, start int) {
	hi := max(s.SequenceID, s.HighestSequenceID)
	p.emitted(l, inflight{lo: s.SequenceID, hi: hi, one: sendRef{p, id, true}}, check, out, start)
	p.pushed(l, s.SequenceID, hi)
	p.stats.EntriesVerbatim++
	if p.cfg.OnEntry != nil {
		p.cfg.OnEntry(int(max(s.NumMessages, 1)))
	}
}

// pushed moves a lane's de-duplication mark as the broker will when it judges an entry of
// ids lo..hi sent there (MessageDeduplication.isDuplicateNormal): an entry whose first id is
// above the mark is new and moves the mark to its highest; any other is a duplicate and leaves
// it. Tracking the broker's mark exactly, not the highest id sent, keeps a dropped entry's ids
// from making later, new sends look like duplicates.
func (p *Producer) pushed(l *lane, lo, hi uint64) {
	if int64(lo) > l.lastPushed {
		l.lastPushed = int64(hi)
		p.ownMark = max(p.ownMark, int64(hi))
	}
}

// highestLane returns the engine's broker producer whose de-duplication mark is highest: a
// send below an id the engine already sent goes there, so the broker compares it with the mark
// a direct connection would have.
func (p *Producer) highestLane() *lane {
	best := p.lanes[0]
	for _, l := range p.lanes[1:] {
		if !l.shared && l.ready && l.lastPushed > best.lastPushed {
			best = l
		}
	}
	return best
}

func (p *Producer) laneOf(producerID uint64) *lane {
	for _, l := range p.lanes {
		if l.producerID == producerID && l.ready {
			return l
		}
	}
	return nil
}

// OwnsProducer reports whether producerID is this engine's: the client's or a bucket lane's.
func (p *Producer) OwnsProducer(producerID uint64) bool { return p.laneOf(producerID) != nil }

// Receipt takes the broker's CommandSendReceipt for the oldest entry in flight on one of the
// engine's producers and releases every client receipt that is now due, in the client's order.
func (p *Producer) Receipt(r wire.SendReceipt, out *Output) error {
	l := p.laneOf(r.ProducerID)
	if l == nil || len(l.entries) == 0 {
		return fmt.Errorf("%w: producer %d sequence id %d", ErrUnexpectedReceipt, r.ProducerID, r.SequenceID)
	}
	e, ok := l.take(func(e *inflight) bool { return e.lo == r.SequenceID })
	switch {
	case ok:
	case r.SequenceID < l.entries[0].lo:
		return nil // a late receipt for something no longer in flight: clients ignore these too
	default:
		return fmt.Errorf("%w: producer %d sequence id %d", ErrUnexpectedReceipt, r.ProducerID, r.SequenceID)
	}
	if e.adopted {
		cs := p.send(e.one.id)
		cs.seq, cs.highest = r.SequenceID, r.HighestSequenceID
	}
	if e.tag != 0 && p.cfg.OnTagged != nil {
		p.cfg.OnTagged(e.tag, r.LedgerID, r.EntryID, false)
	}
	var buf [1]sendRef
	refs := e.refs(&buf)
	for _, ref := range refs {
		cs := ref.p.send(ref.id)
		cs.parts--
		if ref.first {
			// Contract 2: the receipt names the entry holding the send's first message.
			cs.hasID, cs.ledger, cs.entry = true, r.LedgerID, r.EntryID
		}
	}
	releaseAll(refs, out)
	p.recycleRefs(&e)
	switch {
	case r.HasMessageID && r.LedgerID != dupLedger:
		// Stored: the broker's persisted mark is now at least this entry's highest id.
		l.persisted = max(l.persisted, int64(max(e.hi, r.SequenceID, r.HighestSequenceID)))
	case r.HasMessageID:
		// A duplicate: the broker said so only because its persisted mark reached the first id.
		l.persisted = max(l.persisted, int64(e.lo))
	}
	p.releaseWaiting(l, false, out)
	p.flushIdle(l, out)
	return nil
}

// maxFreeRefs bounds the recycled sendRef slices a Producer keeps.
const maxFreeRefs = 64

// refSlice returns a slice of n sendRefs for an entry of several sends, recycled from entries
// already answered when one is large enough, so the steady state does not allocate per entry.
func (p *Producer) refSlice(n int) []sendRef {
	for i := len(p.freeRefs) - 1; i >= 0; i-- {
		if r := p.freeRefs[i]; cap(r) >= n {
			p.freeRefs[i] = p.freeRefs[len(p.freeRefs)-1]
			p.freeRefs = p.freeRefs[:len(p.freeRefs)-1]
			return r[:n]
		}
	}
	return make([]sendRef, n)
}

// recycleRefs keeps an answered entry's sendRef slice for refSlice.
func (p *Producer) recycleRefs(e *inflight) {
	if e.more != nil && len(p.freeRefs) < maxFreeRefs {
		clear(e.more) // drop the references to the engines they name
		p.freeRefs = append(p.freeRefs, e.more[:0])
	}
	e.more = nil
}

// refs returns the entry's sends, using buf (the caller's, on its stack) for the single case.
func (e *inflight) refs(buf *[1]sendRef) []sendRef {
	if e.more != nil {
		return e.more
	}
	buf[0] = e.one
	return buf[:]
}

// releaseAll releases the due receipts of every engine an entry concerned.
func releaseAll(refs []sendRef, out *Output) {
	var last *Producer
	for _, ref := range refs {
		if ref.p != last {
			ref.p.release(out)
			last = ref.p
		}
	}
}

// SendError takes the broker's CommandSendError for the oldest entry in flight on one of the
// engine's producers: every client send with a message in that entry gets the same error, in
// order.
func (p *Producer) SendError(producerID, seq uint64, code pulsarpb.ServerError, message string, out *Output) error {
	l := p.laneOf(producerID)
	if l == nil || len(l.entries) == 0 {
		return fmt.Errorf("%w: send error for producer %d sequence id %d", ErrUnexpectedReceipt, producerID, seq)
	}
	e, ok := l.take(func(e *inflight) bool { return e.hi == seq || e.lo == seq })
	if !ok {
		return fmt.Errorf("%w: send error for producer %d sequence id %d", ErrUnexpectedReceipt, producerID, seq)
	}
	if e.adopted {
		p.send(e.one.id).seq = seq
	}
	if e.tag != 0 && p.cfg.OnTagged != nil {
		p.cfg.OnTagged(e.tag, 0, 0, true)
	}
	var buf [1]sendRef
	refs := e.refs(&buf)
	for _, ref := range refs {
		cs := ref.p.send(ref.id)
		cs.parts--
		if !cs.failed {
			cs.failed, cs.errCode, cs.errMessage = true, code, message
		}
	}
	releaseAll(refs, out)
	p.recycleRefs(&e)
	// The broker resets its marks after a failed write; held sends are its to judge now.
	p.releaseWaiting(l, true, out)
	return nil
}

// release writes the receipts (or errors) of the oldest sends that are complete.
func (p *Producer) release(out *Output) {
	for p.Pending() > 0 {
		cs := &p.sends[p.sendHead]
		if cs.parts > 0 || cs.unflushed > 0 {
			return
		}
		if p.dead {
			p.popSend()
			continue
		}
		if cs.failed {
			// The broker names a failed send by max(sequence_id, highest_sequence_id); Java's
			// recovery compares against that.
			out.Client = wire.AppendSendErrorFrame(out.Client, p.cfg.ProducerID, max(cs.seq, cs.highest), cs.errCode, cs.errMessage)
			p.stats.ErrorsToClient++
		} else {
			r := wire.SendReceipt{ProducerID: p.cfg.ProducerID, SequenceID: cs.seq, HighestSequenceID: cs.highest,
				HasMessageID: cs.hasID, LedgerID: cs.ledger, EntryID: cs.entry}
			out.Client = wire.AppendSendReceiptFrame(out.Client, &r)
			p.stats.ReceiptsToClient++
			if p.cfg.OnReceipt != nil {
				p.cfg.OnReceipt(cs.sentAt)
			}
		}
		p.popSend()
	}
}
