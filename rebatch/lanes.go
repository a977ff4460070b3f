package rebatch

import (
	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// Bucket lanes. Under the buckets policy each bucket is its own broker producer, named
// LaneName(client producer, bucket), created by the engine on the client's connection with
// producer and request ids the caller allocates outside the client's range. Each lane is a
// sequence space of its own: a lane's entries carry the client's per-message sequence ids,
// which rise strictly within a bucket because the client's do, so broker de-duplication stays
// valid per lane, and after any reconnect a message is a duplicate exactly when its sequence
// id is at or below its lane's last_sequence_id.

// OpenLanes appends the PRODUCER commands that create the bucket producers. newID returns a
// fresh id for each producer and each request, unique on the connection. like is the client's
// own PRODUCER command (nil: none): the lanes take its schema, so the broker checks them as it
// checked the client, and its encrypted, txn_enabled and metadata, so a namespace that
// requires encryption, a transaction buffer still recovering, or a look at the topic's stats
// treats them as the client's producer.
func (p *Producer) OpenLanes(topic string, like *pulsarpb.CommandProducer, newID func() uint64, out *Output) error {
	for i := 1; i < len(p.lanes); i++ {
		l := p.lanes[i]
		if l.producerID != 0 {
			continue // a shared lane another producer already opened
		}
		l.producerID, l.requestID = newID(), newID()
		cmd := &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_PRODUCER.Enum(), Producer: &pulsarpb.CommandProducer{
			Topic: proto.String(topic), ProducerId: proto.Uint64(l.producerID), RequestId: proto.Uint64(l.requestID),
			ProducerName: proto.String(l.name), UserProvidedProducerName: proto.Bool(true),
		}}
		if like != nil {
			c := cmd.Producer
			c.Schema, c.Encrypted, c.TxnEnabled, c.Metadata = like.Schema, like.Encrypted, like.TxnEnabled, like.Metadata
		}
		var err error
		if out.Broker, err = wire.AppendCommandFrame(out.Broker, cmd); err != nil {
			return err
		}
	}
	return nil
}

// OwnsRequest reports whether requestID is one of the engine's outstanding PRODUCER requests.
func (p *Producer) OwnsRequest(requestID uint64) bool {
	for i := 1; i < len(p.lanes); i++ {
		if p.lanes[i].requestID == requestID && !p.lanes[i].ready {
			return true
		}
	}
	return false
}

// LaneOpened takes the broker's PRODUCER_SUCCESS for a lane and reports whether every lane is
// now ready.
func (p *Producer) LaneOpened(requestID uint64, lastSequenceID int64) bool {
	for i := 1; i < len(p.lanes); i++ {
		if l := p.lanes[i]; l.requestID == requestID && !l.ready {
			l.ready, l.lastPushed, l.persisted = true, lastSequenceID, lastSequenceID
			if l.shared {
				l.seqNext = uint64(max(lastSequenceID+1, 0))
			}
		}
	}
	return p.Ready()
}

// Ready reports whether every broker producer of the engine exists.
func (p *Producer) Ready() bool {
	for i := range p.lanes {
		if !p.lanes[i].ready {
			return false
		}
	}
	return true
}

// LastSequenceID is the last_sequence_id to give the client: the highest sequence id any of
// the engine's producers has persisted, so a client that resumes from it never reuses an id.
func (p *Producer) LastSequenceID() int64 {
	last := p.lanes[0].lastPushed
	for i := 1; i < len(p.lanes); i++ {
		if !p.lanes[i].shared { // a shared lane's ids are the proxy's, not the client's
			last = max(last, p.lanes[i].lastPushed)
		}
	}
	return last
}

// LaneProducers returns the broker producer ids of the bucket lanes, created or being
// created.
func (p *Producer) LaneProducers() []uint64 {
	var ids []uint64
	for i := 1; i < len(p.lanes); i++ {
		if p.lanes[i].producerID != 0 {
			ids = append(ids, p.lanes[i].producerID)
		}
	}
	return ids
}

// CloseLanes appends CLOSE_PRODUCER for each bucket producer, with request ids from newID,
// after flushing every open batch when flush is set; it returns those request ids, whose
// answers are the caller's to swallow.
func (p *Producer) CloseLanes(newID func() uint64, flush bool, out *Output) ([]uint64, error) {
	if flush {
		if err := p.Flush(out); err != nil {
			return nil, err
		}
	}
	var reqs []uint64
	for _, id := range p.ownLaneProducers() {
		req := newID()
		cmd := &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_CLOSE_PRODUCER.Enum(), CloseProducer: &pulsarpb.CommandCloseProducer{
			ProducerId: proto.Uint64(id), RequestId: proto.Uint64(req)}}
		var err error
		if out.Broker, err = wire.AppendCommandFrame(out.Broker, cmd); err != nil {
			return reqs, err
		}
		reqs = append(reqs, req)
	}
	return reqs, nil
}

// ownLaneProducers returns the ids of the bucket lanes, which die with the engine; a shared
// lane outlives any one of its producers.
func (p *Producer) ownLaneProducers() []uint64 {
	var ids []uint64
	for i := 1; i < len(p.lanes); i++ {
		if l := p.lanes[i]; l.producerID != 0 && !l.shared {
			ids = append(ids, l.producerID)
		}
	}
	return ids
}

// SharedLane is the broker producer several client producers of one topic write through
// under coalesce with merge_producers. It belongs to the connection's event loop.
type SharedLane struct{ l *lane }

// NewSharedLane returns a shared lane whose broker producer will be called name.
func NewSharedLane(name string) *SharedLane {
	return &SharedLane{l: &lane{name: name, shared: true, lastPushed: -1}}
}

// ProducerID is the shared lane's broker producer id (0 until an engine opened it).
func (s *SharedLane) ProducerID() uint64 { return s.l.producerID }

// Abandon makes an engine release nothing more: the broker closed its producer and the client
// will re-create it under the same id and resend.
func (p *Producer) Abandon() { p.dead = true }

// Abandoned reports whether Abandon was called.
func (p *Producer) Abandoned() bool { return p.dead }

// DiscardOpen drops every open batch of the engine's own lanes (the client left: its unsent
// messages will be resent by the client). A shared lane's batch is left to its other members.
func (p *Producer) DiscardOpen() {
	for _, l := range p.lanes {
		if !l.shared {
			l.open.n = 0
			l.open.buf = l.open.buf[:0]
			l.open.sends = l.open.sends[:0]
			p.dropWaiting(l) // held frames are not written either: the client resends
		}
	}
}
