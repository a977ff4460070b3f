package wire

import (
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

func consumerFrame(t testing.TB, cmd *pulsarpb.BaseCommand) Frame {
	t.Helper()
	b, err := AppendCommandFrame(nil, cmd)
	if err != nil {
		t.Fatal(err)
	}
	f, _, err := ReadFrame(b, 5<<20)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func mid(l, e uint64, ackSet ...int64) *pulsarpb.MessageIdData {
	return &pulsarpb.MessageIdData{LedgerId: proto.Uint64(l), EntryId: proto.Uint64(e), AckSet: ackSet}
}

func TestConsumerCommandsAreReadWithoutDecoding(t *testing.T) {
	ack := pulsarpb.BaseCommand_ACK.Enum()
	redeliver := pulsarpb.BaseCommand_REDELIVER_UNACKNOWLEDGED_MESSAGES.Enum()
	cases := []struct {
		name       string
		cmd        *pulsarpb.BaseCommand
		consumer   uint64
		ids        []EntryID
		cumulative bool
		all        bool
	}{
		{"individual ack of two entries", &pulsarpb.BaseCommand{Type: ack, Ack: &pulsarpb.CommandAck{ConsumerId: proto.Uint64(7),
			AckType: pulsarpb.CommandAck_Individual.Enum(), MessageId: []*pulsarpb.MessageIdData{mid(3, 4), mid(3, 5)}}},
			7, []EntryID{{3, 4}, {3, 5}}, false, false},
		{"batch-index ack settles no entry", &pulsarpb.BaseCommand{Type: ack, Ack: &pulsarpb.CommandAck{ConsumerId: proto.Uint64(7),
			AckType: pulsarpb.CommandAck_Individual.Enum(), MessageId: []*pulsarpb.MessageIdData{mid(3, 4, 6), mid(3, 6)}}},
			7, []EntryID{{3, 6}}, false, false},
		{"cumulative ack", &pulsarpb.BaseCommand{Type: ack, Ack: &pulsarpb.CommandAck{ConsumerId: proto.Uint64(9),
			AckType: pulsarpb.CommandAck_Cumulative.Enum(), MessageId: []*pulsarpb.MessageIdData{mid(3, 4)}}},
			9, nil, true, false},
		{"redeliver named entries", &pulsarpb.BaseCommand{Type: redeliver, RedeliverUnacknowledgedMessages: &pulsarpb.CommandRedeliverUnacknowledgedMessages{
			ConsumerId: proto.Uint64(2), MessageIds: []*pulsarpb.MessageIdData{mid(1, 1)}}},
			2, []EntryID{{1, 1}}, false, false},
		{"redeliver everything", &pulsarpb.BaseCommand{Type: redeliver, RedeliverUnacknowledgedMessages: &pulsarpb.CommandRedeliverUnacknowledgedMessages{
			ConsumerId: proto.Uint64(2)}},
			2, nil, false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := consumerFrame(t, c.cmd)
			consumer, ids, cumulative, all, ok := Acked(f, nil)
			if !ok || consumer != c.consumer || !(len(ids) == len(c.ids) && (len(ids) == 0 || reflect.DeepEqual(ids, c.ids))) || cumulative != c.cumulative || all != c.all {
				t.Fatalf("Acked = %d %v cumulative=%v all=%v ok=%v; want %d %v %v %v", consumer, ids, cumulative, all, ok, c.consumer, c.ids, c.cumulative, c.all)
			}
			if id, ok := ConsumerID(f.Command(), f.Type()); !ok || id != c.consumer {
				t.Fatalf("ConsumerID = %d %v, want %d", id, ok, c.consumer)
			}
		})
	}
	msg := consumerFrame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_MESSAGE.Enum(), Message: &pulsarpb.CommandMessage{
		ConsumerId: proto.Uint64(11), MessageId: mid(12, 13), RedeliveryCount: proto.Uint32(1)}})
	if c, id, ok := MessageEntry(msg.Command()); !ok || c != 11 || id != (EntryID{12, 13}) {
		t.Fatalf("MessageEntry = %d %v %v, want 11 12:13", c, id, ok)
	}
}

func TestAckedDoesNotAllocate(t *testing.T) {
	f := consumerFrame(t, &pulsarpb.BaseCommand{Type: pulsarpb.BaseCommand_ACK.Enum(), Ack: &pulsarpb.CommandAck{ConsumerId: proto.Uint64(7),
		AckType: pulsarpb.CommandAck_Individual.Enum(), MessageId: []*pulsarpb.MessageIdData{mid(3, 4), mid(3, 5)}}})
	buf := make([]EntryID, 0, 8)
	if n := testing.AllocsPerRun(100, func() { _, buf, _, _, _ = Acked(f, buf[:0]) }); n != 0 {
		t.Fatalf("Acked allocates %.1f times per call", n)
	}
}

// FuzzConsumerCommands checks the allocation-free readers against the generated decoder on
// any command bytes the decoder accepts.
func FuzzConsumerCommands(f *testing.F) {
	for _, cmd := range []*pulsarpb.BaseCommand{
		{Type: pulsarpb.BaseCommand_ACK.Enum(), Ack: &pulsarpb.CommandAck{ConsumerId: proto.Uint64(7), MessageId: []*pulsarpb.MessageIdData{mid(3, 4, 1)}}},
		{Type: pulsarpb.BaseCommand_MESSAGE.Enum(), Message: &pulsarpb.CommandMessage{ConsumerId: proto.Uint64(1), MessageId: mid(2, 3)}},
		{Type: pulsarpb.BaseCommand_REDELIVER_UNACKNOWLEDGED_MESSAGES.Enum(), RedeliverUnacknowledgedMessages: &pulsarpb.CommandRedeliverUnacknowledgedMessages{ConsumerId: proto.Uint64(1)}},
	} {
		b, _ := proto.Marshal(cmd)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, cmdBytes []byte) {
		var cmd pulsarpb.BaseCommand
		if (proto.UnmarshalOptions{AllowPartial: true}).Unmarshal(cmdBytes, &cmd) != nil || cmd.Type == nil {
			return
		}
		fr, _, err := ReadFrame(rawFrame(cmdBytes), 5<<20)
		if err != nil {
			return
		}
		switch cmd.GetType() {
		case pulsarpb.BaseCommand_MESSAGE:
			m := cmd.GetMessage()
			c, id, ok := MessageEntry(fr.Command())
			if m != nil && m.ConsumerId != nil && m.MessageId != nil && m.MessageId.LedgerId != nil && m.MessageId.EntryId != nil {
				if !ok || c != m.GetConsumerId() || id != (EntryID{m.MessageId.GetLedgerId(), m.MessageId.GetEntryId()}) {
					t.Fatalf("MessageEntry = %d %v %v; decoder: %v", c, id, ok, m)
				}
			}
		case pulsarpb.BaseCommand_ACK:
			a := cmd.GetAck()
			c, ids, cumulative, _, ok := Acked(fr, nil)
			if a == nil || a.ConsumerId == nil {
				return
			}
			if !ok || c != a.GetConsumerId() || cumulative != (a.GetAckType() == pulsarpb.CommandAck_Cumulative) {
				t.Fatalf("Acked = %d cumulative=%v ok=%v; decoder: %v", c, cumulative, ok, a)
			}
			var want []EntryID
			for _, m := range a.MessageId {
				if !cumulative && len(m.AckSet) == 0 && m.LedgerId != nil && m.EntryId != nil {
					want = append(want, EntryID{m.GetLedgerId(), m.GetEntryId()})
				}
			}
			if len(ids) != len(want) || len(want) > 0 && !reflect.DeepEqual(ids, want) {
				t.Fatalf("Acked ids %v; decoder %v", ids, want)
			}
		}
	})
}
