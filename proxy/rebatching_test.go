package proxy

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/chunkdedup"
	"github.com/rebatchproxy/rebatchproxy/rebatch"
	"github.com/rebatchproxy/rebatchproxy/route"
	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// capture is an Outputs that records what the path wrote.
type capture struct{ broker, client []*pulsarpb.BaseCommand }

func decodeAll(t *testing.T, b []byte) []*pulsarpb.BaseCommand {
	t.Helper()
	var out []*pulsarpb.BaseCommand
	for len(b) > 0 {
		f, n, err := wire.ReadFrame(b, 5<<20)
		if err != nil {
			t.Fatal(err)
		}
		cmd := &pulsarpb.BaseCommand{}
		if err := wire.DecodeCommand(f, cmd); err != nil {
			t.Fatal(err)
		}
		out = append(out, cmd)
		b = b[n:]
	}
	return out
}

type captureOut struct {
	t *testing.T
	c *capture
}

func (o captureOut) ToBroker(b []byte) { o.c.broker = append(o.c.broker, decodeAll(o.t, b)...) }
func (o captureOut) ToClient(b []byte) { o.c.client = append(o.c.client, decodeAll(o.t, b)...) }

func cmdFrame(t *testing.T, cmd *pulsarpb.BaseCommand) wire.Frame {
	t.Helper()
	b, err := wire.AppendCommandFrame(nil, cmd)
	return frameOf(t, b, err)
}

// frameOf reads the frame an Append function built (and fails on its error).
func frameOf(t *testing.T, b []byte, err error) wire.Frame {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	f, _, err := wire.ReadFrame(b, 5<<20)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// readyProducer opens client producer id (named name, request reqID) on topic persistent://a/b/t
// through p and has the broker accept it, with nothing persisted before.
func readyProducer(t *testing.T, p ProducerPath, out Outputs, id, reqID uint64, name string) {
	t.Helper()
	if _, err := p.FromClient(cmdFrame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PRODUCER.Enum(), Producer: &pulsarpb.CommandProducer{
		Topic: proto.String("persistent://a/b/t"), ProducerId: proto.Uint64(id), RequestId: proto.Uint64(reqID)}}), out); err != nil {
		t.Fatal(err)
	}
	if _, err := p.FromBroker(cmdFrame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PRODUCER_SUCCESS.Enum(), ProducerSuccess: &pulsarpb.CommandProducerSuccess{
		RequestId: proto.Uint64(reqID), ProducerName: proto.String(name), LastSequenceId: proto.Int64(-1)}}), out); err != nil {
		t.Fatal(err)
	}
}

// bucketsPath returns a path with a two-bucket policy for topic a/b/t whose client producer 7
// (request 3) the broker has just accepted; it returns the lane PRODUCER commands sent.
func bucketsPath(t *testing.T) (ProducerPath, *capture, []*pulsarpb.CommandProducer) {
	t.Helper()
	m, err := route.NewMatcher([]route.Rule[rebatch.Policy]{{Pattern: "a/b/*", Policy: rebatch.Policy{Kind: rebatch.Buckets, Buckets: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	p := RebatchPaths(NewPolicies(m), nil, NewChunkDedup(chunkdedup.Config{}), slog.New(slog.NewTextHandler(io.Discard, nil)))(ConnInfo{ID: 1, MaxMessageSize: 5 << 20})
	c := &capture{}
	out := captureOut{t, c}
	v, err := p.FromClient(cmdFrame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PRODUCER.Enum(), Producer: &pulsarpb.CommandProducer{
		Topic: proto.String("persistent://a/b/t"), ProducerId: proto.Uint64(7), RequestId: proto.Uint64(3),
		Schema:    &pulsarpb.Schema{Name: proto.String("s"), SchemaData: []byte("{}"), Type: pulsarpb.Schema_Json.Enum()},
		Encrypted: proto.Bool(true), TxnEnabled: proto.Bool(true), Metadata: []*pulsarpb.KeyValue{{Key: proto.String("app"), Value: proto.String("x")}}}}), out)
	if err != nil || v != Forward {
		t.Fatalf("PRODUCER: %v %v", v, err)
	}
	v, err = p.FromBroker(cmdFrame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PRODUCER_SUCCESS.Enum(), ProducerSuccess: &pulsarpb.CommandProducerSuccess{
		RequestId: proto.Uint64(3), ProducerName: proto.String("p"), LastSequenceId: proto.Int64(4)}}), out)
	if err != nil || v != Consumed {
		t.Fatalf("PRODUCER_SUCCESS must wait for the bucket producers: %v %v", v, err)
	}
	var lanes []*pulsarpb.CommandProducer
	for _, cmd := range c.broker {
		if cmd.GetType() == pulsarpb.BaseCommand_PRODUCER {
			lanes = append(lanes, cmd.GetProducer())
		}
	}
	if len(lanes) != 2 || len(c.client) != 0 {
		t.Fatalf("%d lane PRODUCERs, %d frames to the client", len(lanes), len(c.client))
	}
	// The lanes are the broker's view of the client's producer: its schema, encryption,
	// transactions and metadata, under ids and names of their own.
	for _, l := range lanes {
		if l.GetSchema().GetName() != "s" || !l.GetEncrypted() || !l.GetTxnEnabled() || len(l.GetMetadata()) != 1 ||
			l.GetProducerId() == 7 || l.GetRequestId() == 3 || l.GetProducerName() == "" {
			t.Fatalf("lane PRODUCER %v", l)
		}
	}
	return p, c, lanes
}

// Given a buckets producer whose bucket producers are being created,
// when the broker accepts them (persisted up to 9 on one of them),
// then the client gets exactly one PRODUCER_SUCCESS, for its own request, with
// last_sequence_id 9 (contract 4), and the lanes' successes never reach it (contract 5).
func TestBucketProducersReadyReleaseTheClientsSuccess(t *testing.T) {
	p, c, lanes := bucketsPath(t)
	out := captureOut{t, c}
	for i, l := range lanes {
		v, err := p.FromBroker(cmdFrame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PRODUCER_SUCCESS.Enum(), ProducerSuccess: &pulsarpb.CommandProducerSuccess{
			RequestId: l.RequestId, ProducerName: l.ProducerName, LastSequenceId: proto.Int64(int64(9 - 9*i))}}), out)
		if err != nil || v != Consumed {
			t.Fatalf("lane %d success: %v %v", i, v, err)
		}
	}
	if len(c.client) != 1 || c.client[0].GetType() != pulsarpb.BaseCommand_PRODUCER_SUCCESS {
		t.Fatalf("client got %v", c.client)
	}
	if ps := c.client[0].GetProducerSuccess(); ps.GetRequestId() != 3 || ps.GetLastSequenceId() != 9 {
		t.Fatalf("client's success %v", ps)
	}
}

// Given a ready buckets producer,
// when the broker closes one of its bucket producers (an unload, naming the broker the topic
// moved to), and then answers requests the path made itself,
// then the client is told to close its own producer 7, never the bucket producer's id, as the
// broker would tell it (same request id and assigned broker), and the answers to the path's
// requests are not forwarded (contract 5).
func TestBucketProducerClosedClosesTheClientsProducerOnly(t *testing.T) {
	p, c, lanes := bucketsPath(t)
	out := captureOut{t, c}
	for _, l := range lanes {
		if _, err := p.FromBroker(cmdFrame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PRODUCER_SUCCESS.Enum(), ProducerSuccess: &pulsarpb.CommandProducerSuccess{
			RequestId: l.RequestId, ProducerName: l.ProducerName, LastSequenceId: proto.Int64(-1)}}), out); err != nil {
			t.Fatal(err)
		}
	}
	c.client, c.broker = nil, nil

	v, err := p.FromBroker(cmdFrame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_CLOSE_PRODUCER.Enum(), CloseProducer: &pulsarpb.CommandCloseProducer{
		ProducerId: lanes[0].ProducerId, RequestId: proto.Uint64(50), AssignedBrokerServiceUrl: proto.String("pulsar://b2:6650"),
		AssignedBrokerServiceUrlTls: proto.String("pulsar+ssl://b2:6651")}}), out)
	if err != nil || v != Consumed {
		t.Fatalf("lane close: %v %v (the connection must stay up)", v, err)
	}
	if len(c.client) != 1 || c.client[0].GetCloseProducer().GetProducerId() != 7 {
		t.Fatalf("client got %v, want one CLOSE_PRODUCER for its producer 7", c.client)
	}
	// As the broker's own close would: its request id, and where the topic went.
	if cp := c.client[0].GetCloseProducer(); cp.GetRequestId() != 50 || cp.GetAssignedBrokerServiceUrl() != "pulsar://b2:6650" ||
		cp.GetAssignedBrokerServiceUrlTls() != "pulsar+ssl://b2:6651" {
		t.Fatalf("client's CLOSE_PRODUCER %v, want the lane close's request id and assigned broker", cp)
	}
	// The broker then answers the path's own CLOSE_PRODUCERs, and closes producer 7 itself.
	var own []uint64
	for _, cmd := range c.broker {
		if cp := cmd.GetCloseProducer(); cp != nil {
			own = append(own, cp.GetRequestId())
		}
	}
	if len(own) == 0 {
		t.Fatal("the path did not close its producers on the broker")
	}
	c.client = nil
	for _, req := range own {
		v, err := p.FromBroker(cmdFrame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_SUCCESS.Enum(), Success: &pulsarpb.CommandSuccess{RequestId: proto.Uint64(req)}}), out)
		if err != nil || v != Consumed {
			t.Fatalf("answer to own request %d: %v %v", req, v, err)
		}
	}
	v, err = p.FromBroker(cmdFrame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_CLOSE_PRODUCER.Enum(), CloseProducer: &pulsarpb.CommandCloseProducer{
		ProducerId: proto.Uint64(7), RequestId: proto.Uint64(51)}}), out)
	if err != nil || v != Consumed || len(c.client) != 0 {
		t.Fatalf("broker's own close of 7: %v %v, client got %v; want it swallowed (the client was told already)", v, err, c.client)
	}
}

// Given a coalesce producer (client producer 1) whose entry numbered 100 is in flight,
// when the client sends 40 sends of 120 KiB numbered 1 to 40 (below 100: the engine holds them
// until the broker can judge them, 4.8 MiB in all), and then the broker acknowledges entry 100,
// then the path reports a backlog while they are held (the proxy slows the client) and none once
// the receipt has released them.
func TestFramesHeldBehindOutOfOrderSendsSlowTheClient(t *testing.T) {
	m, err := route.NewMatcher([]route.Rule[rebatch.Policy]{{Pattern: "a/b/*", Policy: rebatch.Policy{Kind: rebatch.Coalesce}}})
	if err != nil {
		t.Fatal(err)
	}
	p := RebatchPaths(NewPolicies(m), nil, NewChunkDedup(chunkdedup.Config{}), slog.New(slog.NewTextHandler(io.Discard, nil)))(ConnInfo{ID: 1, MaxMessageSize: 5 << 20})
	c := &capture{}
	out := captureOut{t, c}
	readyProducer(t, p, out, 1, 3, "p")
	send := func(seq uint64, size int) {
		t.Helper()
		b, err := wire.AppendSendFrameMetadata(nil, &wire.Send{ProducerID: 1, SequenceID: seq},
			&pulsarpb.MessageMetadata{ProducerName: proto.String("p"), SequenceId: proto.Uint64(seq), PublishTime: proto.Uint64(1)}, make([]byte, size))
		if _, err := p.FromClient(frameOf(t, b, err), out); err != nil {
			t.Fatal(err)
		}
	}
	send(100, 10)
	bl := p.(Backlogger)

	for seq := uint64(1); seq <= 40; seq++ {
		send(seq, 120<<10)
	}
	held := bl.Backlogged()
	if _, err := p.FromBroker(receiptFrame(t, 100, 3, 0), out); err != nil {
		t.Fatal(err)
	}

	if !held || bl.Backlogged() {
		t.Fatalf("backlogged while held: %v, after the receipt: %v", held, bl.Backlogged())
	}
}

// Given a coalesce connection with two producers, where producer 1 has a batch open behind its
// first send in flight (a flush due at max_delay),
// when producer 2 sends and its send leaves alone at once,
// then the path still wakes for producer 1's batch at its deadline (a send looks only at its own
// engine, and that must not lose another's deadline), and a Tick once that batch has left with
// the receipt finds no deadline left.
func TestAnotherProducersSendKeepsAnOpenBatchsDeadline(t *testing.T) {
	m, err := route.NewMatcher([]route.Rule[rebatch.Policy]{{Pattern: "a/b/*", Policy: rebatch.Policy{Kind: rebatch.Coalesce, MaxDelay: 10 * time.Millisecond}}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	p := RebatchPaths(NewPolicies(m), nil, NewChunkDedup(chunkdedup.Config{}), slog.New(slog.NewTextHandler(io.Discard, nil)))(
		ConnInfo{ID: 1, MaxMessageSize: 5 << 20, Now: func() time.Time { return now }})
	c := &capture{}
	out := captureOut{t, c}
	for _, id := range []uint64{1, 2} {
		readyProducer(t, p, out, id, 10+id, fmt.Sprint("p", id))
	}
	send := func(id, seq uint64) {
		t.Helper()
		b, err := wire.AppendSendFrameMetadata(nil, &wire.Send{ProducerID: id, SequenceID: seq},
			&pulsarpb.MessageMetadata{ProducerName: proto.String(fmt.Sprint("p", id)), SequenceId: proto.Uint64(seq), PublishTime: proto.Uint64(1)}, make([]byte, 10))
		if _, err := p.FromClient(frameOf(t, b, err), out); err != nil {
			t.Fatal(err)
		}
	}
	send(1, 0) // leaves alone
	send(1, 1) // held in the open batch behind it
	due := now.Add(10 * time.Millisecond)
	if d := p.NextDeadline(); !d.Equal(due) {
		t.Fatalf("deadline %v with producer 1's batch open, want %v", d, due)
	}
	now = now.Add(time.Millisecond)

	send(2, 0)

	if d := p.NextDeadline(); d.IsZero() || d.After(due) {
		t.Fatalf("deadline %v after producer 2's send, want at most %v", d, due)
	}
	if _, err := p.FromBroker(receiptFrame(t, 0, 3, 0), out); err != nil { // producer 1's first: its batch leaves
		t.Fatal(err)
	}
	if err := p.Tick(due, out); err != nil {
		t.Fatal(err)
	}
	if d := p.NextDeadline(); !d.IsZero() {
		t.Fatalf("deadline %v with no batch open", d)
	}
}

// mergedPath returns a path under coalesce with merge_producers (max_pending_sends 4) whose
// client producers 1 and 2 on a/b/t are ready on their shared lane, the lane's producer id, and
// the clock the path reads. Producer i is created under max_delay delays[i-1] (the policy
// reloaded in between when they differ).
func mergedPath(t *testing.T, delays [2]time.Duration) (ProducerPath, *capture, uint64, *time.Time) {
	t.Helper()
	matcher := func(d time.Duration) *route.Matcher[rebatch.Policy] {
		m, err := route.NewMatcher([]route.Rule[rebatch.Policy]{{Pattern: "a/b/*", Policy: rebatch.Policy{
			Kind: rebatch.Coalesce, MergeProducers: true, MaxPendingSends: 4, MaxDelay: d}}})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	pols := NewPolicies(matcher(delays[0]))
	now := time.Unix(1000, 0)
	var ids idAllocator
	p := RebatchPaths(pols, nil, NewChunkDedup(chunkdedup.Config{}), slog.New(slog.NewTextHandler(io.Discard, nil)))(
		ConnInfo{ID: 1, MaxMessageSize: 5 << 20, Now: func() time.Time { return now }, NewID: ids.next})
	c := &capture{}
	out := captureOut{t, c}
	lane := uint64(0)
	for _, id := range []uint64{1, 2} {
		pols.Store(matcher(delays[id-1]))
		if _, err := p.FromClient(cmdFrame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PRODUCER.Enum(), Producer: &pulsarpb.CommandProducer{
			Topic: proto.String("persistent://a/b/t"), ProducerId: proto.Uint64(id), RequestId: proto.Uint64(10 + id)}}), out); err != nil {
			t.Fatal(err)
		}
		c.broker = nil
		if _, err := p.FromBroker(cmdFrame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PRODUCER_SUCCESS.Enum(), ProducerSuccess: &pulsarpb.CommandProducerSuccess{
			RequestId: proto.Uint64(10 + id), ProducerName: proto.String(fmt.Sprint("p", id)), LastSequenceId: proto.Int64(-1)}}), out); err != nil {
			t.Fatal(err)
		}
		for _, cmd := range c.broker { // the shared lane's own producer, opened with the first
			if cmd.GetType() == pulsarpb.BaseCommand_PRODUCER {
				lane = cmd.GetProducer().GetProducerId()
				if _, err := p.FromBroker(cmdFrame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PRODUCER_SUCCESS.Enum(), ProducerSuccess: &pulsarpb.CommandProducerSuccess{
					RequestId: proto.Uint64(cmd.GetProducer().GetRequestId()), ProducerName: proto.String(cmd.GetProducer().GetProducerName()), LastSequenceId: proto.Int64(-1)}}), out); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if lane == 0 {
		t.Fatal("no shared lane producer was opened")
	}
	c.broker, c.client = nil, nil
	return p, c, lane, &now
}

// Given two client producers merged on one shared lane (max_pending_sends 4), where producer 2
// has 3 sends pending (its backlog is high: the proxy stops reading the client),
// when the broker acknowledges every entry of the lane (receipts come to the lane's first
// producer's engine),
// then the backlog clears, so reading from the client resumes.
func TestSharedLaneReceiptsClearAnotherMembersBacklog(t *testing.T) {
	p, c, lane, now := mergedPath(t, [2]time.Duration{10 * time.Millisecond, 10 * time.Millisecond})
	out := captureOut{t, c}
	for seq := uint64(0); seq < 3; seq++ {
		b, err := wire.AppendSendFrameMetadata(nil, &wire.Send{ProducerID: 2, SequenceID: seq},
			&pulsarpb.MessageMetadata{ProducerName: proto.String("p2"), SequenceId: proto.Uint64(seq), PublishTime: proto.Uint64(1)}, make([]byte, 10))
		if _, err := p.FromClient(frameOf(t, b, err), out); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Tick(now.Add(time.Second), out); err != nil { // whatever is open leaves
		t.Fatal(err)
	}
	bl := p.(Backlogger)
	if !bl.Backlogged() {
		t.Fatal("3 of 4 sends pending: the backlog must be high")
	}
	var receipts []wire.Frame
	for _, cmd := range c.broker {
		if s := cmd.GetSend(); cmd.GetType() == pulsarpb.BaseCommand_SEND && s.GetProducerId() == lane {
			receipts = append(receipts, cmdFrame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_SEND_RECEIPT.Enum(),
				SendReceipt: &pulsarpb.CommandSendReceipt{ProducerId: proto.Uint64(lane), SequenceId: proto.Uint64(s.GetSequenceId()),
					HighestSequenceId: proto.Uint64(s.GetHighestSequenceId()), MessageId: &pulsarpb.MessageIdData{LedgerId: proto.Uint64(3), EntryId: proto.Uint64(s.GetSequenceId())}}}))
		}
	}
	if len(receipts) == 0 {
		t.Fatal("nothing was sent on the shared lane")
	}

	for _, f := range receipts {
		if _, err := p.FromBroker(f, out); err != nil {
			t.Fatal(err)
		}
	}

	if bl.Backlogged() {
		t.Fatalf("every entry acknowledged (%d client receipts out), yet the backlog is still high", len(c.client))
	}
}

// Given two client producers merged on one shared lane, producer 1 created under max_delay
// 100ms and producer 2 under 5ms (the policy was reloaded between them),
// when producer 1's second send opens a batch on the lane behind its first, in flight,
// then the path wakes within 5ms: producer 2's engine flushes the shared batch by its own delay.
func TestSharedLaneWakesAtItsEarliestMembersDelay(t *testing.T) {
	p, c, _, now := mergedPath(t, [2]time.Duration{100 * time.Millisecond, 5 * time.Millisecond})
	out := captureOut{t, c}
	send := func(seq uint64) {
		t.Helper()
		b, err := wire.AppendSendFrameMetadata(nil, &wire.Send{ProducerID: 1, SequenceID: seq},
			&pulsarpb.MessageMetadata{ProducerName: proto.String("p1"), SequenceId: proto.Uint64(seq), PublishTime: proto.Uint64(1)}, make([]byte, 10))
		if _, err := p.FromClient(frameOf(t, b, err), out); err != nil {
			t.Fatal(err)
		}
	}
	send(0)

	send(1)

	if d := p.NextDeadline(); d.IsZero() || d.After(now.Add(5*time.Millisecond)) {
		t.Fatalf("deadline %v, want at most %v", d, now.Add(5*time.Millisecond))
	}
}
