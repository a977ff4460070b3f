package wire

import (
	"errors"
	"testing"

	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

func TestReadHead(t *testing.T) {
	send := AppendSendFrame(nil, &Send{ProducerID: 7, SequenceID: 9, IsChunk: true}, []byte{0x0a, 0x01, 'p'}, make([]byte, 20000))
	fr, n, err := ReadFrame(send, 0)
	if err != nil {
		t.Fatal(err)
	}
	headEnd := frameHeaderLen + fr.CommandSize()
	corrupt := append([]byte(nil), send[:headEnd]...)
	corrupt[4], corrupt[5], corrupt[6], corrupt[7] = 0, 0x10, 0, 0 // command larger than the frame

	cases := []struct {
		name    string
		buf     []byte
		max     int
		wantErr error
	}{
		{"size prefix only", send[:4], 0, ErrIncomplete},
		{"command cut", send[:headEnd-1], 0, ErrIncomplete},
		{"command whole, body to come", send[:headEnd], 0, nil},
		{"whole frame", send, 0, nil},
		{"command larger than its frame", corrupt, 0, ErrCorruptFrame},
		{"frame over the size limit", send[:headEnd], 100, ErrFrameTooLarge},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, err := ReadHead(c.buf, c.max)
			if !errors.Is(err, c.wantErr) {
				t.Fatalf("err %v, want %v", err, c.wantErr)
			}
			if err != nil {
				return
			}
			if h.Len != n || h.Type != pulsarpb.BaseCommand_SEND {
				t.Fatalf("head len %d type %v, want %d SEND", h.Len, h.Type, n)
			}
			s, err := ParseSendHead(h)
			if err != nil || s.ProducerID != 7 || s.SequenceID != 9 || !s.IsChunk {
				t.Fatalf("ParseSendHead %+v, %v", s, err)
			}
		})
	}
}
