package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// be32 builds a big-endian u32.
func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// rawFrame builds [total][cmdSize][cmd][rest] with consistent sizes.
func rawFrame(cmd []byte, rest ...[]byte) []byte {
	body := cat(append([][]byte{cmd}, rest...)...)
	return cat(be32(uint32(4+len(body))), be32(uint32(len(cmd))), body)
}

// sendCmd is BaseCommand{type: SEND, send: {producer_id: 1, sequence_id: 2}}.
var sendCmd = []byte{0x08, 0x06, 0x32, 0x04, 0x08, 0x01, 0x10, 0x02}

// pingCmd is BaseCommand{type: PING, ping: {}}; field 18 needs a 2-byte tag.
var pingCmd = []byte{0x08, 0x12, 0x92, 0x01, 0x00}

func checksumBlock(md, payload []byte) []byte {
	span := cat(be32(uint32(len(md))), md, payload)
	return cat([]byte{0x0e, 0x01}, be32(CRC32C(span)), span)
}

func TestReadFrame(t *testing.T) {
	md := []byte{0x0a, 0x01, 'p', 0x10, 0x07, 0x18, 0x09} // producer "p", seq 7, publish 9
	payload := []byte("hello")
	bem := []byte{0x08, 0x2a, 0x10, 0x03}

	tests := []struct {
		name    string
		buf     []byte
		max     int
		wantErr error
		wantN   int // checked when wantErr is nil or ErrCorruptFrame
		check   func(t *testing.T, f Frame)
	}{
		{name: "empty", buf: nil, wantErr: ErrIncomplete},
		{name: "partial prefix", buf: []byte{0, 0, 0}, wantErr: ErrIncomplete},
		{name: "partial body", buf: rawFrame(pingCmd)[:9], wantErr: ErrIncomplete},
		{
			name: "simple ping", buf: rawFrame(pingCmd), wantN: 8 + len(pingCmd),
			check: func(t *testing.T, f Frame) {
				if f.Type() != pulsarpb.BaseCommand_PING || f.HasPayload() || f.CommandSize() != len(pingCmd) {
					t.Fatalf("got type %v payload %v cmdSize %d", f.Type(), f.HasPayload(), f.CommandSize())
				}
				if f.Metadata() != nil || f.Payload() != nil || f.ChecksummedBytes() != nil {
					t.Fatal("simple frame exposes payload parts")
				}
				if !errors.Is(f.VerifyChecksum(), ErrNotPayloadFrame) {
					t.Fatal("VerifyChecksum on simple frame")
				}
			},
		},
		{
			name: "send with checksum", buf: rawFrame(sendCmd, checksumBlock(md, payload)),
			wantN: 8 + len(sendCmd) + 6 + 4 + len(md) + len(payload),
			check: func(t *testing.T, f Frame) {
				if f.Type() != pulsarpb.BaseCommand_SEND || !f.HasPayload() || !f.HasChecksum() || f.HasBrokerEntryMetadata() {
					t.Fatalf("flags: %v %v %v %v", f.Type(), f.HasPayload(), f.HasChecksum(), f.HasBrokerEntryMetadata())
				}
				if !bytes.Equal(f.Metadata(), md) || !bytes.Equal(f.Payload(), payload) {
					t.Fatalf("metadata %x payload %q", f.Metadata(), f.Payload())
				}
				if f.ChecksumOffset() != 8+len(sendCmd)+2 || f.MetadataOffset() != f.ChecksumOffset()+8 ||
					f.PayloadOffset() != f.MetadataOffset()+len(md) || f.MetadataSize() != len(md) {
					t.Fatalf("offsets crc %d md %d payload %d", f.ChecksumOffset(), f.MetadataOffset(), f.PayloadOffset())
				}
				if err := f.VerifyChecksum(); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "message with broker entry metadata", buf: rawFrame(sendCmd, []byte{0x0e, 0x02}, be32(uint32(len(bem))), bem, checksumBlock(md, payload)),
			wantN: 8 + len(sendCmd) + 6 + len(bem) + 6 + 4 + len(md) + len(payload),
			check: func(t *testing.T, f Frame) {
				if !bytes.Equal(f.BrokerEntryMetadata(), bem) || f.BrokerEntryMetadataOffset() != 8+len(sendCmd)+6 {
					t.Fatalf("bem %x at %d", f.BrokerEntryMetadata(), f.BrokerEntryMetadataOffset())
				}
				if !bytes.Equal(f.Payload(), payload) || f.VerifyChecksum() != nil {
					t.Fatal("payload or checksum after bem")
				}
			},
		},
		{
			name: "payload without checksum", buf: rawFrame(sendCmd, be32(uint32(len(md))), md, payload),
			wantN: 8 + len(sendCmd) + 4 + len(md) + len(payload),
			check: func(t *testing.T, f Frame) {
				if f.HasChecksum() || !bytes.Equal(f.Metadata(), md) || !bytes.Equal(f.Payload(), payload) {
					t.Fatal("no-checksum layout")
				}
				if !errors.Is(f.VerifyChecksum(), ErrNoChecksum) {
					t.Fatal("want ErrNoChecksum")
				}
			},
		},
		{
			name: "bad checksum is not a read error", buf: func() []byte {
				b := rawFrame(sendCmd, checksumBlock(md, payload))
				b[len(b)-1] ^= 1
				return b
			}(),
			wantN: 8 + len(sendCmd) + 6 + 4 + len(md) + len(payload),
			check: func(t *testing.T, f Frame) {
				if !errors.Is(f.VerifyChecksum(), ErrChecksum) {
					t.Fatal("want ErrChecksum")
				}
			},
		},
		{name: "too large before body", buf: be32(DefaultMaxMessageSize + FramePadding - 3), wantErr: ErrFrameTooLarge},
		{name: "too large custom max", buf: be32(1024 + FramePadding - 3), max: 1024, wantErr: ErrFrameTooLarge},
		{name: "largest allowed size waits for body", buf: be32(1024 + FramePadding - 4), max: 1024, wantErr: ErrIncomplete},
		{name: "total below command size field", buf: []byte{0, 0, 0, 3, 0, 0, 0}, wantErr: ErrCorruptFrame},
		{name: "command size beyond frame", buf: cat(be32(6), be32(3), []byte{0x08, 0x12}), wantErr: ErrCorruptFrame, wantN: 10},
		{name: "no type", buf: rawFrame([]byte{0x92, 0x01, 0x00}), wantErr: ErrCorruptFrame, wantN: 11},
		{name: "empty command", buf: rawFrame(nil), wantErr: ErrCorruptFrame, wantN: 8},
		{name: "truncated nested", buf: rawFrame([]byte{0x08, 0x06, 0x32, 0x09, 0x08}), wantErr: ErrCorruptFrame, wantN: 13},
		{name: "group wire type", buf: rawFrame([]byte{0x08, 0x06, 0x0b}), wantErr: ErrCorruptFrame, wantN: 11},
		{name: "type zero", buf: rawFrame([]byte{0x08, 0x00}), wantErr: ErrCorruptFrame, wantN: 10},
		{name: "metadata size beyond frame", buf: rawFrame(sendCmd, []byte{0x0e, 0x01, 0, 0, 0, 0}, be32(100), md), wantErr: ErrCorruptFrame, wantN: 8 + len(sendCmd) + 10 + len(md)},
		{name: "headers shorter than metadata size", buf: rawFrame(sendCmd, []byte{0, 0}), wantErr: ErrCorruptFrame, wantN: 8 + len(sendCmd) + 2},
		{name: "bem size beyond frame", buf: rawFrame(sendCmd, []byte{0x0e, 0x02}, be32(50), bem), wantErr: ErrCorruptFrame, wantN: 8 + len(sendCmd) + 6 + len(bem)},
		{
			name: "last type field wins", buf: rawFrame([]byte{0x08, 0x06, 0x08, 0x12}), wantN: 12,
			check: func(t *testing.T, f Frame) {
				if f.Type() != pulsarpb.BaseCommand_PING {
					t.Fatalf("type %v", f.Type())
				}
			},
		},
		{
			name: "unnamed type value passes through", buf: rawFrame([]byte{0x08, 0xc8, 0x01}), wantN: 11,
			check: func(t *testing.T, f Frame) {
				if f.Type() != 200 {
					t.Fatalf("type %v", f.Type())
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, n, err := ReadFrame(tc.buf, tc.max)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if (err == nil || errors.Is(err, ErrCorruptFrame)) && n != tc.wantN {
				t.Fatalf("n = %d, want %d", n, tc.wantN)
			}
			if err != nil && !errors.Is(err, ErrCorruptFrame) && n != 0 {
				t.Fatalf("n = %d on %v", n, err)
			}
			if err == nil {
				if f.Len() != n || !bytes.Equal(f.Bytes(), tc.buf[:n]) || f.TotalSize() != n-4 {
					t.Fatal("Bytes/Len do not cover the frame")
				}
				if tc.check != nil {
					tc.check(t, f)
				}
			}
		})
	}
}

func TestReadFrameStream(t *testing.T) {
	var stream []byte
	stream = AppendPingFrame(stream)
	stream = AppendSendFrame(stream, &Send{ProducerID: 3, SequenceID: 4}, []byte{0x10, 0x04}, []byte("x"))
	stream = AppendPongFrame(stream)
	want := []pulsarpb.BaseCommand_Type{pulsarpb.BaseCommand_PING, pulsarpb.BaseCommand_SEND, pulsarpb.BaseCommand_PONG}

	// Feed the stream one byte at a time, as a socket might.
	var got []pulsarpb.BaseCommand_Type
	var buf []byte
	for i := 0; i < len(stream); i++ {
		buf = append(buf, stream[i])
		for {
			f, n, err := ReadFrame(buf, 0)
			if errors.Is(err, ErrIncomplete) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, f.Type())
			buf = buf[n:]
		}
	}
	if len(buf) != 0 || len(got) != len(want) {
		t.Fatalf("got %v, %d bytes left", got, len(buf))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("frame %d: %v, want %v", i, got[i], want[i])
		}
	}
}

func TestFrameLen(t *testing.T) {
	if n, err := FrameLen(be32(4), 0); err != nil || n != 8 {
		t.Fatalf("FrameLen = %d, %v", n, err)
	}
	if _, err := FrameLen(be32(0xFFFFFFFF), 0); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("4 GiB frame: %v", err)
	}
	if got := MaxFrameLen(0); got != 5*1024*1024+10*1024 {
		t.Fatalf("MaxFrameLen(0) = %d", got)
	}
}

// The header-only path must not allocate: the proxy calls it per frame.
func TestReadFrameAllocs(t *testing.T) {
	md := []byte{0x0a, 0x01, 'p', 0x10, 0x07, 0x18, 0x09}
	buf := AppendSendFrame(nil, &Send{ProducerID: 1, SequenceID: 2, NumMessages: 3}, md, bytes.Repeat([]byte{'a'}, 100))
	buf = AppendPingFrame(buf)
	allocs := testing.AllocsPerRun(1000, func() {
		b := buf
		for len(b) > 0 {
			f, n, err := ReadFrame(b, 0)
			if err != nil {
				panic(err)
			}
			_ = f.Type()
			_ = f.Payload()
			_ = f.Metadata()
			if f.HasPayload() {
				if err := f.VerifyChecksum(); err != nil {
					panic(err)
				}
				if _, err := ParseSend(f); err != nil {
					panic(err)
				}
			}
			b = b[n:]
		}
	})
	if allocs != 0 {
		t.Fatalf("ReadFrame path allocates %v times per run", allocs)
	}
}

func TestCRC32C(t *testing.T) {
	// The standard check value of CRC-32C (RFC 3720, appendix B.4).
	if got := CRC32C([]byte("123456789")); got != 0xE3069283 {
		t.Fatalf("CRC32C = %#x", got)
	}
	if got := UpdateCRC32C(CRC32C([]byte("1234")), []byte("56789")); got != 0xE3069283 {
		t.Fatalf("UpdateCRC32C = %#x", got)
	}
}

// TestParseSendReadsTheSubCommandADecoderKeeps: the sub-command the frame reader finds on its
// walk for the type is used only when no later field can replace it; otherwise the command is
// looked up again, so ParseSend reads what the generated decoder keeps in every layout.
func TestParseSendReadsTheSubCommandADecoderKeeps(t *testing.T) {
	send := func(seq byte) []byte { return []byte{0x32, 0x04, 0x08, 0x01, 0x10, seq} } // send {producer 1, sequence seq}
	typ := []byte{0x08, 0x06}
	tests := []struct {
		name    string
		cmd     []byte
		wantSeq uint64
		wantErr bool
	}{
		{"type, then send", cat(typ, send(2)), 2, false},
		{"send, then type", cat(send(3), typ), 3, false},
		{"send given twice: the last counts", cat(typ, send(4), send(5)), 5, false},
		{"an unknown bytes field after the send", cat(typ, send(6), []byte{0xfa, 0x07, 0x01, 'x'}), 6, false},
		{"an unknown bytes field between two sends", cat(typ, send(7), []byte{0xfa, 0x07, 0x01, 'x'}, send(8)), 8, false},
		{"no send", cat(typ, []byte{0xfa, 0x07, 0x01, 'x'}), 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, _, err := ReadFrame(rawFrame(tc.cmd), 1<<20)
			if err != nil {
				t.Fatal(err)
			}

			s, err := ParseSend(f)

			if tc.wantErr {
				if !errors.Is(err, ErrMalformedCommand) {
					t.Fatalf("err = %v, want ErrMalformedCommand", err)
				}
				return
			}
			var cmd pulsarpb.BaseCommand
			if err != nil || DecodeCommand(f, &cmd) != nil {
				t.Fatalf("ParseSend: %v", err)
			}
			if s.SequenceID != tc.wantSeq || cmd.GetSend().GetSequenceId() != tc.wantSeq || s.ProducerID != 1 {
				t.Fatalf("sequence %d (decoder: %d), want %d", s.SequenceID, cmd.GetSend().GetSequenceId(), tc.wantSeq)
			}
		})
	}
}

// A BaseCommand with a field numbered above 2^29-1 is one the protobuf runtime (and the broker's)
// refuses, so the frame reader refuses it too, before anything parses its sub-command.
func TestReadFrameRefusesAFieldNumberProtobufDoesNotAllow(t *testing.T) {
	cmd := cat([]byte{0x80, 0x80, 0x80, 0x80, 0x10, 0x01}, sendCmd) // field 2^29, varint 1; then a SEND

	_, _, err := ReadFrame(rawFrame(cmd), 1<<20)

	if !errors.Is(err, ErrCorruptFrame) {
		t.Fatalf("err = %v, want ErrCorruptFrame", err)
	}
	var dec pulsarpb.BaseCommand
	if proto.Unmarshal(cmd, &dec) == nil {
		t.Fatal("the protobuf runtime decodes it: the reader must not be stricter")
	}
}
