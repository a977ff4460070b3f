package rebatch

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

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
	// MaxPendingSends bounds the client sends awaiting receipts (contract 7); 0 means 10,000.
	MaxPendingSends int
	// OnEntry, when set, is called with the message count of every entry sent to the broker.
	OnEntry func(messages int)
	// OnReceipt, when set, is called with the time Send received a client send whose receipt
	// is being released.
	OnReceipt func(sentAt time.Time)
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
	FlushGroup       uint64 // properties changed, schema changed, or a send that is never merged
	FlushExplicit    uint64
	ReceiptsToClient uint64
	ErrorsToClient   uint64
}

// clientSend is one CommandSend of the client awaiting its receipt.
type clientSend struct {
	sentAt     time.Time
	seq        uint64 // CommandSend.sequence_id, echoed verbatim
	highest    uint64 // CommandSend.highest_sequence_id, echoed when the client set it
	unflushed  int    // messages of this send still in the open batch
	parts      int    // entries holding this send's messages, sent and not yet acknowledged
	hasID      bool
	ledger     uint64
	entry      uint64
	failed     bool
	errCode    pulsarpb.ServerError
	errMessage string
}

// inflight is one entry sent to the broker and not yet acknowledged. Its sends are the
// contiguous range first..last of client send numbers.
type inflight struct {
	lo, hi      uint64
	first, last uint64
}

// msgRef is one message of the send being taken apart; slices alias the client's frame or the
// engine's decompression buffer.
type msgRef struct {
	smm     []byte
	payload []byte
	seq     uint64
}

// openBatch is the batch being filled.
type openBatch struct {
	n                 int
	buf               []byte // uncompressed batch payload
	lo, hi            uint64
	first, last       uint64 // client send numbers
	group             []byte // encoded restricted properties; nil under coalesce
	schema            []byte
	compression       pulsarpb.CompressionType
	publishTime       uint64
	key               []byte // first message's key, copied to the outer metadata
	keyB64, isOrdKey  bool
	started           time.Time
	hasPublishTime    bool
	hasSchema         bool
	partitionKeyFirst bool
}

// Producer is the engine for one client producer under a rewriting policy (coalesce or
// properties). It is a pure state machine: it never does I/O and takes time from its caller.
//
// A Producer belongs to the goroutine that owns the client's connection (its event loop); no
// method may be called concurrently.
type Producer struct {
	cfg      Config
	restrict restriction
	budget   int // maximum uncompressed payload bytes per entry

	// sends[i] is client send number sendBase+i.
	sends    []clientSend
	sendBase uint64
	entries  []inflight

	// lastPushed is the highest sequence id sent to the broker under this producer, as the
	// broker's de-duplication records it (max of sequence_id and highest_sequence_id).
	lastPushed int64

	open  openBatch
	stats Stats

	// Scratch, reused across calls so the steady state does not allocate per frame.
	md        pulsarpb.MessageMetadata
	outMD     pulsarpb.MessageMetadata
	smm       pulsarpb.SingleMessageMetadata
	msgs      []msgRef
	unzip     []byte
	single    []byte
	zipped    []byte
	groupKV   []byte
	groupVals [][]byte
}

// NewProducer returns the engine for one client producer.
func NewProducer(cfg Config) (*Producer, error) {
	if err := cfg.Policy.Validate(); err != nil {
		return nil, err
	}
	if cfg.Policy.Kind == Passthrough {
		return nil, fmt.Errorf("%w: passthrough producers do not use the engine", ErrInvalidPolicy)
	}
	if cfg.MaxMessageSize <= 0 {
		cfg.MaxMessageSize = 5 << 20
	}
	if cfg.MaxPendingSends <= 0 {
		cfg.MaxPendingSends = 10000
	}
	p := &Producer{cfg: cfg, lastPushed: cfg.LastSequenceID}
	if cfg.Policy.Kind == Properties {
		p.restrict = compileRestriction(cfg.Policy.Restricted)
	}
	// Outer metadata of a built entry stays well under 8 KiB; the broker refuses an entry whose
	// metadata and payload exceed max_message_size.
	p.budget = min(cfg.Policy.MaxBytes, cfg.MaxMessageSize-8<<10)
	if p.budget < 1<<10 {
		p.budget = 1 << 10
	}
	return p, nil
}

// Stats returns the engine's counters.
func (p *Producer) Stats() Stats { return p.stats }

// Pending returns the number of client sends awaiting their receipt.
func (p *Producer) Pending() int { return len(p.sends) }

// Deadline returns when the open batch must be flushed by Tick, if one is open.
func (p *Producer) Deadline() (time.Time, bool) {
	if p.open.n == 0 {
		return time.Time{}, false
	}
	return p.open.started.Add(p.cfg.Policy.MaxDelay), true
}

// Tick flushes the open batch if its delay has expired.
func (p *Producer) Tick(now time.Time, out *Output) error {
	if d, ok := p.Deadline(); ok && !now.Before(d) {
		p.stats.FlushDelay++
		return p.flush(out)
	}
	return nil
}

// Flush sends the open batch now (for example before the producer closes).
func (p *Producer) Flush(out *Output) error {
	if p.open.n == 0 {
		return nil
	}
	p.stats.FlushExplicit++
	return p.flush(out)
}

// Send takes one client SEND frame of this producer.
func (p *Producer) Send(now time.Time, f wire.Frame, out *Output) error {
	s, err := wire.ParseSend(f)
	if err != nil {
		return err
	}
	if s.ProducerID != p.cfg.ProducerID {
		return ErrWrongProducer
	}
	if len(p.sends) >= p.cfg.MaxPendingSends {
		return ErrTooManyPending
	}
	if !f.HasPayload() {
		return ErrMalformedSend
	}
	p.md.Reset()
	if err := wire.DecodeMetadata(f.Metadata(), &p.md); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformedSend, err)
	}
	p.stats.ClientSends++
	// A send whose checksum fails is the broker's to refuse (ChecksumError), exactly as on a
	// direct connection; rebuilding it would launder corrupt data into a valid entry.
	if neverMerged(&s, &p.md) || !f.HasChecksum() || f.VerifyChecksum() != nil {
		return p.verbatim(now, f, &s, out)
	}
	msgs, err := p.explode(f, &s)
	if err != nil {
		return err
	}
	p.stats.ClientMessages += uint64(len(msgs))
	lo, hi := msgs[0].seq, msgs[len(msgs)-1].seq
	if !sequential(msgs, s.SequenceID) || int64(hi) <= p.lastPushed {
		// Sequence ids this engine cannot split safely (key-based client batches), or a resend
		// of something the broker already has: the broker must judge the send exactly as the
		// client made it.
		return p.verbatim(now, f, &s, out)
	}

	// Entry-level fields that differ from the open batch end it.
	if p.open.n > 0 && !p.sameEntryFields() {
		p.stats.FlushGroup++
		if err := p.flush(out); err != nil {
			return err
		}
	}
	id := p.sendBase + uint64(len(p.sends))
	p.sends = append(p.sends, clientSend{sentAt: now, seq: s.SequenceID, highest: s.HighestSequenceID})

	i := 0
	if int64(lo) <= p.lastPushed {
		// The send straddles the broker's de-duplication mark: it is a resend of a send this
		// proxy had split, part of which was stored. The stored part goes alone, so the broker
		// drops it as a duplicate without taking the new part with it.
		if p.open.n > 0 {
			p.stats.FlushGroup++
			if err := p.flush(out); err != nil {
				return err
			}
		}
		for i < len(msgs) && int64(msgs[i].seq) <= p.lastPushed {
			p.add(now, id, msgs[i], nil)
			i++
		}
		p.stats.FlushGroup++
		if err := p.flush(out); err != nil {
			return err
		}
	}
	for ; i < len(msgs); i++ {
		m := msgs[i]
		group := p.groupOf(m.smm)
		if p.open.n > 0 {
			switch {
			case !bytes.Equal(group, p.open.group):
				p.stats.FlushGroup++
			case len(p.open.buf)+4+len(m.smm)+len(m.payload) > p.budget:
				p.stats.FlushMaxBytes++
			default:
				goto add
			}
			if err := p.flush(out); err != nil {
				return err
			}
		}
	add:
		p.add(now, id, m, group)
		if p.open.n >= p.cfg.Policy.MaxMessages {
			p.stats.FlushMaxMessages++
			if err := p.flush(out); err != nil {
				return err
			}
		}
	}
	return nil
}

// neverMerged reports whether a send must be forwarded alone and unchanged (DESIGN.md
// section 2): chunks, markers, transactions, encrypted payloads, delayed delivery and
// replication, whose meaning is tied to the entry as the client built it.
func neverMerged(s *wire.Send, md *pulsarpb.MessageMetadata) bool {
	return s.IsChunk || s.Marker || s.TxnIDLeastBits != 0 || s.TxnIDMostBits != 0 || s.MessageID != nil ||
		md.ChunkId != nil || md.NumChunksFromMsg != nil || md.Uuid != nil ||
		len(md.EncryptionKeys) > 0 || md.EncryptionAlgo != nil || md.EncryptionParam != nil ||
		md.DeliverAtTime != nil || md.MarkerType != nil ||
		md.ReplicatedFrom != nil || len(md.ReplicateTo) > 0 ||
		md.TxnidLeastBits != nil || md.TxnidMostBits != nil
}

// sequential reports whether the messages' sequence ids rise strictly from the send's own
// sequence id, which is what lets the engine cut the send into entries with valid
// de-duplication ranges.
func sequential(msgs []msgRef, sendSeq uint64) bool {
	if msgs[0].seq != sendSeq {
		return false
	}
	for i := 1; i < len(msgs); i++ {
		if msgs[i].seq <= msgs[i-1].seq {
			return false
		}
	}
	return true
}

// explode takes a send apart into messages, each with an encoded SingleMessageMetadata.
func (p *Producer) explode(f wire.Frame, s *wire.Send) ([]msgRef, error) {
	md := &p.md
	payload := f.Payload()
	if c := md.GetCompression(); c != pulsarpb.CompressionType_NONE {
		var err error
		p.unzip, err = compression.Decompress(p.unzip[:0], c, payload, int(md.GetUncompressedSize()), p.cfg.MaxMessageSize*2)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrMalformedSend, err)
		}
		payload = p.unzip
	}
	p.msgs = p.msgs[:0]
	if md.NumMessagesInBatch == nil {
		// A message sent alone: its own fields move from the outer metadata into a
		// SingleMessageMetadata, where a batch keeps them.
		smm := &p.smm
		smm.Reset()
		smm.Properties = md.Properties
		smm.PartitionKey = md.PartitionKey
		smm.PartitionKeyB64Encoded = md.PartitionKeyB64Encoded
		smm.OrderingKey = md.OrderingKey
		smm.EventTime = md.EventTime
		smm.NullValue = md.NullValue
		smm.NullPartitionKey = md.NullPartitionKey
		seq := md.GetSequenceId()
		smm.SequenceId = &seq
		size := int32(len(payload))
		smm.PayloadSize = &size
		var err error
		p.single, err = proto.MarshalOptions{AllowPartial: true, Deterministic: true}.MarshalAppend(p.single[:0], smm)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrMalformedSend, err)
		}
		p.msgs = append(p.msgs, msgRef{smm: p.single, payload: payload, seq: s.SequenceID})
		return p.msgs, nil
	}
	n := int(md.GetNumMessagesInBatch())
	it := batch.NewIterator(payload, n)
	for i := 0; it.Next(); i++ {
		m, meta := it.Message(), it.Meta()
		seq := s.SequenceID + uint64(i)
		if meta.HasSequenceID {
			seq = meta.SequenceID
		}
		p.msgs = append(p.msgs, msgRef{smm: m.Metadata, payload: m.Payload, seq: seq})
	}
	if err := it.Err(); err != nil || len(p.msgs) == 0 {
		return nil, fmt.Errorf("%w: batch payload: %v", ErrMalformedSend, err)
	}
	return p.msgs, nil
}

// sameEntryFields reports whether the send in p.md may share an entry with the open batch:
// the entry-level fields other than compression must match.
func (p *Producer) sameEntryFields() bool {
	return p.open.hasSchema == (p.md.SchemaVersion != nil) && bytes.Equal(p.open.schema, p.md.SchemaVersion)
}

// groupOf returns the encoded restricted properties of a message: for each restricted key in
// sorted order whose value the policy admits, the key and value, length-prefixed. Under
// coalesce every message is in the nil group. The result aliases scratch space until the next
// call.
func (p *Producer) groupOf(smm []byte) []byte {
	if p.cfg.Policy.Kind != Properties {
		return nil
	}
	meta, err := batch.ParseSingleMeta(smm)
	if err != nil {
		return nil
	}
	vals := p.groupVals[:0]
	for range p.restrict.keys {
		vals = append(vals, nil)
	}
	_ = meta.Properties(func(k, v []byte) bool {
		// The first occurrence of a restricted key decides, as clients keep the first.
		if i := p.restrict.index(k); i >= 0 && vals[i] == nil && p.restrict.admits(i, v) {
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
		if v == nil {
			continue
		}
		p.groupKV = binary.AppendUvarint(p.groupKV, uint64(i))
		p.groupKV = binary.AppendUvarint(p.groupKV, uint64(len(v)))
		p.groupKV = append(p.groupKV, v...)
	}
	return p.groupKV
}

// add appends one message to the open batch, opening it if needed.
func (p *Producer) add(now time.Time, id uint64, m msgRef, group []byte) {
	o := &p.open
	if o.n == 0 {
		o.lo, o.first, o.started = m.seq, id, now
		o.group = append(o.group[:0], group...)
		o.hasSchema = p.md.SchemaVersion != nil
		o.schema = append(o.schema[:0], p.md.SchemaVersion...)
		o.compression = p.md.GetCompression()
		if p.cfg.Policy.Compression != nil {
			o.compression = *p.cfg.Policy.Compression
		}
		o.publishTime, o.hasPublishTime = p.md.GetPublishTime(), p.md.PublishTime != nil
		o.key = o.key[:0]
		o.isOrdKey, o.keyB64, o.partitionKeyFirst = false, false, false
		if meta, err := batch.ParseSingleMeta(m.smm); err == nil {
			switch {
			case meta.HasOrderingKey:
				o.key, o.isOrdKey = append(o.key, meta.OrderingKey...), true
			case meta.HasPartitionKey:
				o.key, o.partitionKeyFirst, o.keyB64 = append(o.key, meta.PartitionKey...), true, meta.PartitionKeyB64Encoded
			}
		}
	}
	o.buf = binary.BigEndian.AppendUint32(o.buf, uint32(len(m.smm)))
	o.buf = append(o.buf, m.smm...)
	o.buf = append(o.buf, m.payload...)
	o.n++
	o.hi, o.last = m.seq, id
	p.sends[id-p.sendBase].unflushed++
}

// flush builds the open batch into one entry in batch format and queues it for the broker.
func (p *Producer) flush(out *Output) error {
	o := &p.open
	if o.n == 0 {
		return nil
	}
	md := &p.outMD
	md.Reset()
	md.ProducerName = proto.String(p.cfg.ProducerName)
	md.SequenceId = proto.Uint64(o.lo)
	md.HighestSequenceId = proto.Uint64(o.hi)
	if o.hasPublishTime {
		md.PublishTime = proto.Uint64(o.publishTime)
	}
	md.NumMessagesInBatch = proto.Int32(int32(o.n))
	if o.hasSchema {
		md.SchemaVersion = o.schema
	}
	switch {
	case o.isOrdKey:
		md.OrderingKey = o.key
	case o.partitionKeyFirst:
		md.PartitionKey = proto.String(string(o.key))
		if o.keyB64 {
			md.PartitionKeyB64Encoded = proto.Bool(true)
		}
	}
	// The group's restricted key/values become the entry's outer properties (PIP-191).
	for b := o.group; len(b) > 0; {
		i, n := binary.Uvarint(b)
		b = b[n:]
		l, n := binary.Uvarint(b)
		b = b[n:]
		md.Properties = append(md.Properties, &pulsarpb.KeyValue{Key: proto.String(p.restrict.keys[i]), Value: proto.String(string(b[:l]))})
		b = b[l:]
	}
	payload := o.buf
	codec := o.compression
	if codec != pulsarpb.CompressionType_NONE {
		var err error
		p.zipped, err = compression.Compress(p.zipped[:0], codec, o.buf)
		// Incompressible data can grow; the entry must stay under the broker's limit.
		if err != nil || len(p.zipped) > p.budget {
			codec = pulsarpb.CompressionType_NONE
		} else {
			payload = p.zipped
		}
	}
	if codec != pulsarpb.CompressionType_NONE {
		md.Compression = codec.Enum()
	}
	md.UncompressedSize = proto.Uint32(uint32(len(o.buf)))
	send := wire.Send{ProducerID: p.cfg.ProducerID, SequenceID: o.lo, NumMessages: int32(o.n), HighestSequenceID: o.hi}
	var err error
	out.Broker, err = wire.AppendSendFrameMetadata(out.Broker, &send, md, payload)
	if err != nil {
		return err
	}
	p.entries = append(p.entries, inflight{lo: o.lo, hi: o.hi, first: o.first, last: o.last})
	for id := o.first; id <= o.last; id++ {
		cs := &p.sends[id-p.sendBase]
		cs.parts++
		cs.unflushed = 0
	}
	p.lastPushed = max(p.lastPushed, int64(o.hi))
	p.stats.EntriesBuilt++
	if p.cfg.OnEntry != nil {
		p.cfg.OnEntry(o.n)
	}
	o.n = 0
	o.buf = o.buf[:0]
	return nil
}

// verbatim forwards a client send unchanged, after flushing the open batch so order holds.
func (p *Producer) verbatim(now time.Time, f wire.Frame, s *wire.Send, out *Output) error {
	if p.open.n > 0 {
		p.stats.FlushGroup++
		if err := p.flush(out); err != nil {
			return err
		}
	}
	id := p.sendBase + uint64(len(p.sends))
	p.sends = append(p.sends, clientSend{sentAt: now, seq: s.SequenceID, highest: s.HighestSequenceID, parts: 1})
	hi := max(s.SequenceID, s.HighestSequenceID)
	p.entries = append(p.entries, inflight{lo: s.SequenceID, hi: hi, first: id, last: id})
	p.lastPushed = max(p.lastPushed, int64(hi))
	out.Broker = append(out.Broker, f.Bytes()...)
	p.stats.EntriesVerbatim++
	if p.cfg.OnEntry != nil {
		p.cfg.OnEntry(int(max(s.NumMessages, 1)))
	}
	return nil
}

// Receipt takes the broker's CommandSendReceipt for the oldest entry in flight and releases
// every client receipt that is now due, in the client's order.
func (p *Producer) Receipt(r wire.SendReceipt, out *Output) error {
	if len(p.entries) == 0 || p.entries[0].lo != r.SequenceID {
		return fmt.Errorf("%w: got sequence id %d", ErrUnexpectedReceipt, r.SequenceID)
	}
	e := p.entries[0]
	p.entries = p.entries[1:]
	for id := e.first; id <= e.last; id++ {
		cs := &p.sends[id-p.sendBase]
		cs.parts--
		if !cs.hasID {
			// Entries are acknowledged in order, so the first one to come back for a send is the
			// one that holds its first message (contract 2).
			cs.hasID, cs.ledger, cs.entry = true, r.LedgerID, r.EntryID
		}
	}
	p.release(out)
	return nil
}

// SendError takes the broker's CommandSendError for the oldest entry in flight: every client
// send with a message in that entry gets the same error, in order.
func (p *Producer) SendError(seq uint64, code pulsarpb.ServerError, message string, out *Output) error {
	if len(p.entries) == 0 || (p.entries[0].hi != seq && p.entries[0].lo != seq) {
		return fmt.Errorf("%w: send error for sequence id %d", ErrUnexpectedReceipt, seq)
	}
	e := p.entries[0]
	p.entries = p.entries[1:]
	for id := e.first; id <= e.last; id++ {
		cs := &p.sends[id-p.sendBase]
		cs.parts--
		if !cs.failed {
			cs.failed, cs.errCode, cs.errMessage = true, code, message
		}
	}
	p.release(out)
	return nil
}

// release writes the receipts (or errors) of the oldest sends that are complete.
func (p *Producer) release(out *Output) {
	for len(p.sends) > 0 {
		cs := &p.sends[0]
		if cs.parts > 0 || cs.unflushed > 0 {
			return
		}
		if cs.failed {
			out.Client = wire.AppendSendErrorFrame(out.Client, p.cfg.ProducerID, cs.seq, cs.errCode, cs.errMessage)
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
		p.sends = p.sends[1:]
		p.sendBase++
	}
}
