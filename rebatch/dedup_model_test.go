package rebatch

import (
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/batch"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// A model of the engine between real clients and a real broker with de-duplication on. The
// broker is apache/pulsar's MessageDeduplication.isDuplicateNormal: per producer name a pushed
// and a persisted mark. An entry arrives and is judged: at or below the pushed mark it is a
// duplicate (answered -1:-1 at once, not stored) if also at or below the persisted mark, else
// the broker "cannot determine" (a PersistenceError, also at once); above it the entry is stored,
// the pushed mark becomes max(sequence_id, highest_sequence_id), and once the entry is written
// the persisted mark does too and its receipt goes out. The client numbers its sends as one of
// the released batchers does, checks each receipt against the head of its queue, and, as every
// released client does, resends everything unacknowledged after a connection fault or a send
// error.

// brokerModel is the broker side: de-duplication marks per producer name and what is stored.
type brokerModel struct {
	pushed, persisted map[string]int64
	stored            map[string]int // message body -> copies stored
	entry             uint64
}

func newBrokerModel() *brokerModel {
	return &brokerModel{pushed: map[string]int64{}, persisted: map[string]int64{}, stored: map[string]int{}}
}

// mark is the producer's last_sequence_id as CommandProducerSuccess gives it: the persisted mark.
func (b *brokerModel) mark(name string) int64 {
	if m, ok := b.persisted[name]; ok {
		return m
	}
	return -1
}

// verdict is the broker's judgement of an arriving entry.
type verdict int

const (
	isNew verdict = iota
	isDuplicate
	undecided // "Cannot determine whether the message is a duplicate at this time"
)

// arrive judges one SEND under producer name as it reaches the broker; a new entry is stored.
func (b *brokerModel) arrive(t testing.TB, name string, f wire.Frame) verdict {
	s, err := wire.ParseSend(f)
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := b.pushed[name]; ok && int64(s.SequenceID) <= m {
		if int64(s.SequenceID) <= b.mark(name) {
			return isDuplicate
		}
		return undecided
	}
	b.pushed[name] = int64(max(s.SequenceID, s.HighestSequenceID))
	for _, body := range bodiesOf(t, f) {
		b.stored[body]++
	}
	return isNew
}

// persist completes the write of an arrived new entry and returns its receipt's ledger:entry.
func (b *brokerModel) persist(t testing.TB, name string, f wire.Frame) (uint64, uint64) {
	s, err := wire.ParseSend(f)
	if err != nil {
		t.Fatal(err)
	}
	b.persisted[name] = max(b.mark(name), int64(max(s.SequenceID, s.HighestSequenceID)))
	b.entry++
	return 1, b.entry
}

// judge has one SEND arrive and, when new, be written: a broker with nothing else in flight.
func (b *brokerModel) judge(t testing.TB, name string, f wire.Frame) (uint64, uint64) {
	if b.arrive(t, name, f) != isNew {
		return dupLedger, dupLedger
	}
	return b.persist(t, name, f)
}

// bodiesOf returns the message payloads of a SEND, batched or not.
func bodiesOf(t testing.TB, f wire.Frame) []string {
	md := &pulsarpb.MessageMetadata{}
	if err := wire.DecodeMetadata(f.Metadata(), md); err != nil {
		t.Fatal(err)
	}
	if md.NumMessagesInBatch == nil {
		return []string{string(f.Payload())}
	}
	var out []string
	it := batch.NewIterator(f.Payload(), int(md.GetNumMessagesInBatch()))
	for it.Next() {
		out = append(out, string(it.Message().Payload))
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// numberingStyle is how a released client numbers its sends.
type numberingStyle int

const (
	goDefault    numberingStyle = iota // command = first id, no highest; ids per message
	javaDefault                        // command = first id, highest = last
	cppLast                            // C++ 3.4-4.0: command = last id, no highest
	goKeyBased                         // one send per key, command = the key's first id, sent in that order
	javaKeyBased                       // one send per key, command = highest = the key's largest id
	goBeforeV010                       // one id for the whole batch, none on the messages
	unbatched                          // one message per send
	customIDs                          // application-supplied ids, unique, in any order (Java style)
	numberingStyles
)

var styleNames = []string{"go-default", "java-default", "cpp-last", "go-key-based", "java-key-based", "go-before-v0.10", "unbatched", "custom-ids"}

// modelMsg is one message of the model client.
type modelMsg struct {
	body, key, region string
	seq               uint64
}

// modelSend is one SEND of the model client.
type modelSend struct {
	frame  []byte
	seq    uint64
	bodies []string
}

// buildSend encodes a client SEND. ids: the messages carry their own sequence ids.
func buildSend(t testing.TB, seq, highest uint64, msgs []modelMsg, ids, single bool) modelSend {
	ms := modelSend{seq: seq}
	for _, m := range msgs {
		ms.bodies = append(ms.bodies, m.body)
	}
	props := func(m modelMsg) []*pulsarpb.KeyValue {
		return []*pulsarpb.KeyValue{{Key: proto.String("region"), Value: proto.String(m.region)}}
	}
	md := &pulsarpb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(seq), PublishTime: proto.Uint64(42)}
	var payload []byte
	if single {
		m := msgs[0]
		md.PartitionKey, md.Properties, payload = proto.String(m.key), props(m), []byte(m.body)
	} else {
		for _, m := range msgs {
			smm := &pulsarpb.SingleMessageMetadata{Properties: props(m), PartitionKey: proto.String(m.key), PayloadSize: proto.Int32(int32(len(m.body)))}
			if ids {
				smm.SequenceId = proto.Uint64(m.seq)
			}
			var err error
			if payload, err = batch.AppendNewMessage(payload, smm, []byte(m.body)); err != nil {
				t.Fatal(err)
			}
		}
		md.NumMessagesInBatch = proto.Int32(int32(len(msgs)))
		md.UncompressedSize = proto.Uint32(uint32(len(payload)))
		if highest != 0 {
			md.HighestSequenceId = proto.Uint64(highest)
		}
	}
	s := wire.Send{ProducerID: pid, SequenceID: seq, HighestSequenceID: highest, NumMessages: int32(len(msgs))}
	var err error
	if ms.frame, err = wire.AppendSendFrameMetadata(nil, &s, md, payload); err != nil {
		t.Fatal(err)
	}
	return ms
}

// clientFlush turns one client batch (messages in send order) into the SENDs the style makes,
// numbering the messages from *next.
func clientFlush(t testing.TB, style numberingStyle, msgs []modelMsg, next *uint64, custom func() uint64) []modelSend {
	for i := range msgs {
		switch style {
		case goBeforeV010:
			msgs[i].seq = *next
		case customIDs:
			msgs[i].seq = custom()
		default:
			msgs[i].seq = *next + uint64(i)
		}
	}
	if style == goBeforeV010 {
		*next++
	} else if style != customIDs {
		*next += uint64(len(msgs))
	}
	first, last := msgs[0].seq, msgs[len(msgs)-1].seq
	switch style {
	case goDefault:
		return []modelSend{buildSend(t, first, 0, msgs, true, false)}
	case javaDefault, customIDs:
		return []modelSend{buildSend(t, first, last, msgs, true, false)}
	case cppLast:
		return []modelSend{buildSend(t, last, 0, msgs, true, false)}
	case goBeforeV010:
		return []modelSend{buildSend(t, first, 0, msgs, false, false)}
	case unbatched:
		var out []modelSend
		for _, m := range msgs {
			out = append(out, buildSend(t, m.seq, 0, []modelMsg{m}, true, true))
		}
		return out
	}
	byKey := map[string][]modelMsg{}
	var keys []string
	for _, m := range msgs {
		if _, ok := byKey[m.key]; !ok {
			keys = append(keys, m.key)
		}
		byKey[m.key] = append(byKey[m.key], m)
	}
	var out []modelSend
	for _, k := range keys {
		km := byKey[k]
		if style == goKeyBased {
			out = append(out, buildSend(t, km[0].seq, 0, km, true, false))
		} else {
			top := km[len(km)-1].seq
			out = append(out, buildSend(t, top, top, km, true, false))
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].seq < out[j].seq })
	return out
}

// modelRun is one run of the model: a policy, a style, and a script of operations.
type modelRun struct {
	t       testing.TB
	pol     Policy
	broker  *brokerModel
	p       *Producer
	names   map[uint64]string // broker producer id -> name
	nextID  uint64
	wire    []wire.Frame // frames sent to the broker and not yet judged
	arrived []wire.Frame // new entries the broker is writing, oldest first
	queue   []modelSend  // client sends awaiting their receipt, in order
	now     time.Time
	faults  int // connection faults
	// broken: the client got a send error and will reconnect; errors counts those reconnects.
	broken bool
	errors int
}

func (r *modelRun) connect() {
	t := r.t
	p, err := NewProducer(Config{Policy: r.pol, ProducerID: pid, ProducerName: "p", LastSequenceID: r.broker.mark("p")})
	if err != nil {
		t.Fatal(err)
	}
	r.p, r.names, r.wire, r.broken = p, map[uint64]string{pid: "p"}, nil, false
	if r.pol.Kind == Buckets {
		var out Output
		if err := p.OpenLanes("persistent://a/b/t", nil, func() uint64 { r.nextID++; return r.nextID }, &out); err != nil {
			t.Fatal(err)
		}
		for _, f := range frames(t, out.Broker) {
			var cmd pulsarpb.BaseCommand
			if err := wire.DecodeCommand(f, &cmd); err != nil {
				t.Fatal(err)
			}
			pr := cmd.GetProducer()
			r.names[pr.GetProducerId()] = pr.GetProducerName()
			p.LaneOpened(pr.GetRequestId(), r.broker.mark(pr.GetProducerName()))
		}
	}
	// The client resends everything unacknowledged, as the released clients do.
	for _, s := range r.queue {
		r.send(s)
	}
}

// modelTrace, when set, is told every step of a model run (for debugging a failing script).
var modelTrace func(format string, args ...any)

func (r *modelRun) send(s modelSend) {
	if modelTrace != nil {
		f := frame(r.t, s.frame)
		ws, _ := wire.ParseSend(f)
		modelTrace("client send seq=%d highest=%d bodies=%v", ws.SequenceID, ws.HighestSequenceID, s.bodies)
	}
	var out Output
	if err := r.p.Send(r.now, frame(r.t, s.frame), &out); err != nil {
		r.t.Fatalf("Send: %v", err)
	}
	r.take(&out)
}

// take moves an engine call's output on: broker frames to the wire, client frames to the client.
func (r *modelRun) take(out *Output) {
	t := r.t
	r.wire = append(r.wire, frames(t, slices.Clone(out.Broker))...)
	for _, f := range frames(t, out.Client) {
		if r.broken {
			return // the client has closed the connection
		}
		if f.Type() == pulsarpb.BaseCommand_SEND_ERROR {
			// Every released client closes the connection on this error and resends (reconnect).
			if modelTrace != nil {
				modelTrace("client got a send error; it reconnects")
			}
			r.broken = true
			return
		}
		if f.Type() != pulsarpb.BaseCommand_SEND_RECEIPT {
			t.Fatalf("engine wrote %v to the client", f.Type())
		}
		rc, err := wire.ParseSendReceipt(f)
		if err != nil {
			t.Fatal(err)
		}
		if len(r.queue) == 0 || rc.SequenceID != r.queue[0].seq {
			t.Fatalf("receipt for sequence id %d, the client waits for %v", rc.SequenceID, r.queue[:min(1, len(r.queue))])
		}
		r.queue = r.queue[1:]
	}
}

// arriveOne has the broker judge the oldest frame on the wire: a duplicate is answered -1:-1
// and an undecidable one with an error, both at once; a new one is written (persistOne).
func (r *modelRun) arriveOne() {
	f := r.wire[0]
	r.wire = r.wire[1:]
	s, err := wire.ParseSend(f)
	if err != nil {
		r.t.Fatal(err)
	}
	name, ok := r.names[s.ProducerID]
	if !ok {
		r.t.Fatalf("entry for unknown broker producer %d", s.ProducerID)
	}
	v := r.broker.arrive(r.t, name, f)
	if modelTrace != nil {
		modelTrace("broker %s seq=%d highest=%d bodies=%v -> verdict %d (pushed %d persisted %d)", name, s.SequenceID, s.HighestSequenceID, bodiesOf(r.t, f), v, r.broker.pushed[name], r.broker.mark(name))
	}
	var out Output
	switch v {
	case isNew:
		r.arrived = append(r.arrived, f)
		return
	case isDuplicate:
		err = r.p.Receipt(wire.SendReceipt{ProducerID: s.ProducerID, SequenceID: s.SequenceID, HighestSequenceID: s.HighestSequenceID,
			HasMessageID: true, LedgerID: dupLedger, EntryID: dupLedger}, &out)
	case undecided:
		err = r.p.SendError(s.ProducerID, max(s.SequenceID, s.HighestSequenceID), pulsarpb.ServerError_PersistenceError,
			"Cannot determine whether the message is a duplicate at this time", &out)
	}
	if err != nil {
		r.t.Fatalf("broker answer: %v", err)
	}
	r.take(&out)
}

// persistOne completes the oldest write the broker has in progress and hands its receipt to
// the engine.
func (r *modelRun) persistOne() {
	f := r.arrived[0]
	r.arrived = r.arrived[1:]
	s, _ := wire.ParseSend(f)
	ledger, entry := r.broker.persist(r.t, r.names[s.ProducerID], f)
	var out Output
	if err := r.p.Receipt(wire.SendReceipt{ProducerID: s.ProducerID, SequenceID: s.SequenceID, HighestSequenceID: s.HighestSequenceID,
		HasMessageID: true, LedgerID: ledger, EntryID: entry}, &out); err != nil {
		r.t.Fatalf("Receipt: %v", err)
	}
	r.take(&out)
}

// lose ends the connection after the broker took the first n frames on the wire: the writes
// in progress complete, every answer not yet given is lost, and so are the rest of the wire and
// the engine's open batches; the client reconnects and resends.
func (r *modelRun) lose(n int) {
	for _, f := range r.wire[:min(n, len(r.wire))] {
		s, _ := wire.ParseSend(f)
		if r.broker.arrive(r.t, r.names[s.ProducerID], f) == isNew {
			r.arrived = append(r.arrived, f)
		}
	}
	for _, f := range r.arrived {
		s, _ := wire.ParseSend(f)
		r.broker.persist(r.t, r.names[s.ProducerID], f)
	}
	if modelTrace != nil {
		modelTrace("connection lost after %d frames; %d lost", min(n, len(r.wire)), len(r.wire)-min(n, len(r.wire)))
	}
	r.arrived = nil
	r.connect()
}

// fault is a connection fault after the broker took the first n frames on the wire.
func (r *modelRun) fault(n int) {
	r.faults++
	r.lose(n)
}

// settle reconnects the client, as often as it takes, after a send error broke its connection.
func (r *modelRun) settle() {
	for tries := 0; r.broken; tries++ {
		if tries > 1000 {
			r.t.Fatal("the client reconnects for ever")
		}
		r.errors++
		r.lose(0)
	}
}

// runModel plays a script from fuzz bytes and returns the run and the client's sends in the
// order first made.
func runModel(t testing.TB, data []byte) (*modelRun, numberingStyle, []modelSend) {
	take := func() byte {
		if len(data) == 0 {
			return 0
		}
		b := data[0]
		data = data[1:]
		return b
	}
	style := numberingStyle(take()) % numberingStyles
	var pol Policy
	switch take() % 3 {
	case 0:
		pol = Policy{Kind: Coalesce}
	case 1:
		pol = Policy{Kind: Properties, Restricted: map[string][]string{"region": {"us", "eu"}}}
	default:
		pol = Policy{Kind: Buckets, Buckets: 2 + int(take()%3)}
	}
	pol.MaxMessages = 1 + int(take()%6)
	pol.HoldWhenIdle = take()%2 == 0
	// One script in four has no connection faults, so the broker must store exactly what it
	// stores directly (checkModel).
	faulty := take()%4 != 0
	r := &modelRun{t: t, pol: pol, broker: newBrokerModel(), nextID: 100, now: t0}
	r.connect()
	var next uint64
	usedIDs := map[uint64]bool{}
	custom := func() uint64 {
		id := uint64(take()) % 200
		for usedIDs[id] {
			id++
		}
		usedIDs[id] = true
		return id
	}
	var made []modelSend
	body := 0
	for steps := 0; len(data) > 0 && steps < 400; steps++ {
		switch op := take(); {
		case op < 100: // the client flushes a batch
			n := 1 + int(op%7)
			msgs := make([]modelMsg, n)
			for i := range msgs {
				b := take()
				msgs[i] = modelMsg{body: fmt.Sprintf("m%d", body), key: fmt.Sprintf("k%d", b%5), region: []string{"us", "eu", "ap"}[b/5%3]}
				body++
			}
			for _, s := range clientFlush(t, style, msgs, &next, custom) {
				made = append(made, s)
				r.queue = append(r.queue, s)
				if !r.broken { // else it goes with the resends
					r.send(s)
				}
			}
		case op < 150: // entries reach the broker
			for k := int(op % 4); k >= 0 && len(r.wire) > 0; k-- {
				r.arriveOne()
			}
		case op < 200: // the broker finishes writing some entries
			for k := int(op % 4); k >= 0 && len(r.arrived) > 0; k-- {
				r.persistOne()
			}
		case op < 230: // time passes
			r.now = r.now.Add(20 * time.Millisecond)
			var out Output
			if err := r.p.Tick(r.now, &out); err != nil {
				t.Fatal(err)
			}
			r.take(&out)
		default: // the connection dies after the broker stored some of what was in flight
			if faulty {
				r.fault(int(op % 4))
			}
		}
		r.settle()
	}
	// Drain: everything open is sent and answered, until the client waits for nothing.
	for rounds := 0; len(r.queue) > 0 || len(r.wire) > 0 || len(r.arrived) > 0; rounds++ {
		if rounds > 10000 {
			t.Fatalf("%d sends never answered", len(r.queue))
		}
		r.settle()
		if len(r.wire) > 0 {
			r.arriveOne()
			continue
		}
		if len(r.arrived) > 0 {
			r.persistOne()
			continue
		}
		var out Output
		if err := r.p.Flush(&out); err != nil {
			t.Fatal(err)
		}
		r.take(&out)
		if len(r.wire) == 0 && len(r.queue) > 0 && !r.broken {
			t.Fatalf("the client waits for %d receipts and nothing is in flight", len(r.queue))
		}
	}
	return r, style, made
}

// direct is what a broker stores when the client's sends reach it directly, without faults.
func direct(t testing.TB, made []modelSend) map[string]int {
	b := newBrokerModel()
	for _, s := range made {
		b.judge(t, "p", frame(t, s.frame))
	}
	return b.stored
}

// checkModel asserts the model's contracts on one run.
func checkModel(t testing.TB, r *modelRun, style numberingStyle, made []modelSend) {
	for body, n := range r.broker.stored {
		if n > 1 {
			t.Fatalf("%s, %s: %q stored %d times (faults %d)", styleNames[style], r.pol.Kind, body, n, r.faults)
		}
	}
	if r.faults == 0 {
		// Without faults the broker stores exactly what it stores directly.
		want := direct(t, made)
		for _, s := range made {
			for _, body := range s.bodies {
				if r.broker.stored[body] != want[body] {
					t.Fatalf("%s, %s: %q stored %d times through the engine, %d directly", styleNames[style], r.pol.Kind, body, r.broker.stored[body], want[body])
				}
			}
		}
		return
	}
	if style == customIDs {
		return // ids below an earlier batch's are the broker's to drop, directly too
	}
	// Released clients number every message afresh: every acknowledged message is stored once.
	for _, s := range made {
		for _, body := range s.bodies {
			if r.broker.stored[body] != 1 {
				t.Fatalf("%s, %s: %q acknowledged, stored %d times (faults %d)", styleNames[style], r.pol.Kind, body, r.broker.stored[body], r.faults)
			}
		}
	}
}

// FuzzEngineAgainstBrokerDeduplication plays arbitrary scripts (client batches numbered as a
// released client or an application numbers them, broker answers, time, connection faults with
// resends) through the engine and a model of the broker's de-duplication: no message is ever
// stored twice; without faults the broker stores exactly what it stores directly; with faults
// every message of a released client's numbering is stored exactly once.
func FuzzEngineAgainstBrokerDeduplication(f *testing.F) {
	for style := range numberingStyles {
		for pol := byte(0); pol < 3; pol++ {
			f.Add([]byte{byte(style), pol, 2, 3, 1, 0, 9, 17, 33, 5, 150, 6, 1, 2, 3, 4, 5, 6, 7, 240, 3, 4, 5, 8, 9, 150, 151, 241, 99, 1, 2, 3})
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, style, made := runModel(t, data)
		checkModel(t, r, style, made)
	})
}

// TestEngineAgainstBrokerDeduplication runs the model over many generated scripts per
// numbering style and policy, so the unit run covers what the fuzz target explores.
func TestEngineAgainstBrokerDeduplication(t *testing.T) {
	rng := uint64(1)
	rand := func() byte {
		rng ^= rng << 13
		rng ^= rng >> 7
		rng ^= rng << 17
		return byte(rng)
	}
	for style := range numberingStyles {
		for pol := byte(0); pol < 3; pol++ {
			t.Run(fmt.Sprintf("%s/%d", styleNames[style], pol), func(t *testing.T) {
				for run := 0; run < 100; run++ {
					data := []byte{byte(style), pol}
					for i := 0; i < 300; i++ {
						data = append(data, rand())
					}
					r, st, made := runModel(t, data)
					checkModel(t, r, st, made)
				}
			})
		}
	}
}
