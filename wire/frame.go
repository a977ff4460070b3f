package wire

import (
	"encoding/binary"

	"github.com/rebatchproxy/rebatchproxy/wire/internal/pbscan"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// Sizes and magic numbers of the frame layout (protocol.md section 1).
const (
	// DefaultMaxMessageSize is the broker's default maxMessageSize, used
	// when a CONNECTED carries no max_message_size.
	DefaultMaxMessageSize = 5 * 1024 * 1024

	// FramePadding is what brokers and clients allow on top of
	// maxMessageSize for the command and headers of a frame.
	FramePadding = 10 * 1024

	// MagicChecksum precedes the CRC32C of a payload frame.
	MagicChecksum uint16 = 0x0e01

	// MagicBrokerEntryMetadata precedes the broker-entry-metadata block
	// brokers may put in front of the checksum in MESSAGE frames.
	MagicBrokerEntryMetadata uint16 = 0x0e02

	// frameHeaderLen is [totalSize:u32][commandSize:u32].
	frameHeaderLen = 8
)

// MaxFrameLen returns the largest frame, size prefix included, that a peer
// with the given maxMessageSize accepts. maxMessageSize <= 0 means
// DefaultMaxMessageSize.
func MaxFrameLen(maxMessageSize int) int {
	if maxMessageSize <= 0 {
		maxMessageSize = DefaultMaxMessageSize
	}
	return maxMessageSize + FramePadding
}

// Frame is a parsed view of one frame inside a caller's buffer. It holds
// offsets, not copies: it is valid only while the buffer it was read from is
// unchanged. The zero Frame is not a valid frame.
//
// Layout of a payload frame (all integers big-endian):
//
//	[totalSize:u32][commandSize:u32][BaseCommand]
//	  optional [0x0e02:u16][size:u32][BrokerEntryMetadata]
//	  optional [0x0e01:u16][crc32c:u32]
//	  [metadataSize:u32][MessageMetadata][payload]
//
// A simple frame ends after the BaseCommand.
type Frame struct {
	b   []byte
	typ pulsarpb.BaseCommand_Type
	// Offsets from the start of the frame; 0 means absent, since every
	// part starts after the 8-byte header.
	bemOff     uint32 // first byte of BrokerEntryMetadata
	crcOff     uint32 // first of the 4 checksum bytes
	mdOff      uint32 // first byte of MessageMetadata
	payloadOff uint32 // first payload byte (== len(b) for an empty payload)
	// The sub-command (the BaseCommand field numbered by its type), when
	// parseFrame saw it as the command's last length-delimited field, as
	// every Pulsar client writes it; 0 means not seen, look it up.
	subOff, subEnd uint32
}

// FrameLen reports how many bytes the frame at the start of buf occupies,
// size prefix included, without looking past the prefix. It returns
// ErrIncomplete when fewer than 4 bytes are available, ErrFrameTooLarge
// when the frame exceeds MaxFrameLen(maxMessageSize), and ErrCorruptFrame
// when the size cannot hold a command size.
func FrameLen(buf []byte, maxMessageSize int) (int, error) {
	if len(buf) < 4 {
		return 0, ErrIncomplete
	}
	total := uint64(binary.BigEndian.Uint32(buf))
	if total+4 > uint64(MaxFrameLen(maxMessageSize)) {
		return 0, ErrFrameTooLarge
	}
	if total < 4 {
		return 0, ErrCorruptFrame
	}
	return int(total) + 4, nil
}

// ReadFrame parses the frame at the start of buf. buf may end inside a
// frame or hold many frames; only the first is read. It returns the frame
// view and the number of bytes it occupies, so the next frame starts at
// buf[n:].
//
// Errors:
//   - ErrIncomplete: buf holds only part of the frame (n == 0); call again
//     with more bytes.
//   - ErrFrameTooLarge: the size prefix exceeds MaxFrameLen(maxMessageSize)
//     (n == 0); reported without waiting for the body.
//   - ErrCorruptFrame: the frame is complete but inconsistent. n is the
//     frame's length from its prefix, so a caller may still relay or skip
//     the bytes; the returned Frame is then the zero value.
//
// ReadFrame reads the BaseCommand's type (field 1) with a hand-written scan
// of its top-level fields and locates the headers of payload frames; it
// neither decodes the command nor checks the CRC (see Frame.VerifyChecksum).
// It does not allocate and is safe to call from any goroutine on a buffer
// that goroutine owns.
func ReadFrame(buf []byte, maxMessageSize int) (Frame, int, error) {
	n, err := FrameLen(buf, maxMessageSize)
	if err != nil {
		return Frame{}, 0, err
	}
	if len(buf) < n {
		return Frame{}, 0, ErrIncomplete
	}
	var f Frame
	if !parseFrame(buf[:n:n], &f) {
		return Frame{}, n, ErrCorruptFrame
	}
	return f, n, nil
}

// Head is the start of a frame whose body may still be on its way: enough
// to route the frame (its length and command) before the rest is read. A
// proxy that forwards a frame's bytes as they arrive (cut-through) decides
// on the Head alone.
type Head struct {
	// Len is the whole frame's length, size prefix included.
	Len int
	// Type is the BaseCommand's type.
	Type pulsarpb.BaseCommand_Type
	// Command is the encoded BaseCommand; it aliases the caller's buffer.
	Command []byte
}

// ReadHead parses the size prefix and the BaseCommand at the start of buf,
// which may end anywhere after the command. It checks what ReadFrame checks
// of those parts (size limit, command inside the frame, a typed command) but
// nothing after the command: headers, metadata and payload are the
// receiver's to validate once they arrive.
//
// Errors: ErrIncomplete when buf ends before the command does;
// ErrFrameTooLarge and ErrCorruptFrame as for ReadFrame. It does not
// allocate.
func ReadHead(buf []byte, maxMessageSize int) (Head, error) {
	n, err := FrameLen(buf, maxMessageSize)
	if err != nil {
		return Head{}, err
	}
	if len(buf) < frameHeaderLen {
		return Head{}, ErrIncomplete
	}
	cmdEnd := frameHeaderLen + uint64(binary.BigEndian.Uint32(buf[4:]))
	if cmdEnd > uint64(n) {
		return Head{}, ErrCorruptFrame
	}
	if cmdEnd > uint64(len(buf)) {
		return Head{}, ErrIncomplete
	}
	cmd := buf[frameHeaderLen:cmdEnd:cmdEnd]
	typ, _, _, ok := peekCommandType(cmd)
	if !ok {
		return Head{}, ErrCorruptFrame
	}
	return Head{Len: n, Type: typ, Command: cmd}, nil
}

// parseFrame parses a frame whose length prefix has been checked and whose
// bytes are all present into *f (written in place: it runs per frame); on false *f is not a frame.
func parseFrame(b []byte, f *Frame) bool {
	if len(b) < frameHeaderLen {
		return false
	}
	cmdSize := uint64(binary.BigEndian.Uint32(b[4:]))
	cmdEnd := frameHeaderLen + cmdSize
	if cmdEnd > uint64(len(b)) {
		return false
	}
	typ, subLo, subHi, ok := peekCommandType(b[frameHeaderLen:cmdEnd])
	if !ok {
		return false
	}
	*f = Frame{b: b, typ: typ}
	if subLo >= 0 {
		f.subOff, f.subEnd = uint32(frameHeaderLen+subLo), uint32(frameHeaderLen+subHi)
	}
	if cmdEnd == uint64(len(b)) {
		return true
	}

	// Payload frame: the rest is headers and payload.
	off := uint32(cmdEnd)
	end := uint32(len(b))
	if end-off >= 6 && binary.BigEndian.Uint16(b[off:]) == MagicBrokerEntryMetadata {
		size := binary.BigEndian.Uint32(b[off+2:])
		if uint64(size) > uint64(end-off-6) {
			return false
		}
		f.bemOff = off + 6
		off = f.bemOff + size
	}
	if end-off >= 6 && binary.BigEndian.Uint16(b[off:]) == MagicChecksum {
		f.crcOff = off + 2
		off += 6
	}
	if end-off < 4 {
		return false
	}
	mdSize := binary.BigEndian.Uint32(b[off:])
	if uint64(mdSize) > uint64(end-off-4) {
		return false
	}
	f.mdOff = off + 4
	f.payloadOff = f.mdOff + mdSize
	return true
}

// peekCommandType returns field 1 of a BaseCommand. It walks every
// top-level field, so a later duplicate of field 1 wins as in any protobuf
// decoder, and it rejects truncated fields. Nested messages are skipped by
// length, so the cost is a few varints per frame. The common wire types are
// handled inline (this runs for every frame); groups, which Pulsar never
// sends but decoders skip, go through pbscan.Next.
//
// cmd[subLo:subHi] is the sub-command when the last length-delimited field
// is the one numbered by the type (then no later occurrence can replace it);
// otherwise subLo is -1 and the caller looks it up (pbscan.LastBytes). The
// sub-command is found on the walk the type needs anyway, so a SEND or a
// receipt is not scanned twice.
func peekCommandType(cmd []byte) (typ pulsarpb.BaseCommand_Type, subLo, subHi int, ok bool) {
	var t, lastNum uint64
	found := false
	subLo = -1
	for i := 0; i < len(cmd); {
		key, n := pbscan.Uvarint(cmd[i:])
		if n == 0 || key>>3 == 0 || key>>3 > pbscan.MaxFieldNumber {
			return 0, -1, 0, false
		}
		switch key & 7 {
		case pbscan.Varint:
			v, m := pbscan.Uvarint(cmd[i+n:])
			if m == 0 {
				return 0, -1, 0, false
			}
			if key>>3 == 1 {
				t, found = v, true
			}
			i += n + m
		case pbscan.Bytes:
			l, m := pbscan.Uvarint(cmd[i+n:])
			if m == 0 || l > uint64(len(cmd)-i-n-m) {
				return 0, -1, 0, false
			}
			lastNum, subLo, subHi = key>>3, i+n+m, i+n+m+int(l)
			i += n + m + int(l)
		default:
			_, m := pbscan.Next(cmd[i:])
			if m == 0 {
				return 0, -1, 0, false
			}
			i += m
		}
	}
	if !found || t == 0 || t > 1<<31-1 {
		return 0, -1, 0, false
	}
	if lastNum != t {
		subLo = -1
	}
	return pulsarpb.BaseCommand_Type(t), subLo, subHi, true
}

// subCommand returns the sub-command of f (the BaseCommand field numbered by
// f's type); ok is false when the command has none or is malformed.
func (f Frame) subCommand() (body []byte, ok bool) {
	if f.subOff != 0 {
		return f.b[f.subOff:f.subEnd:f.subEnd], true
	}
	return subCommand(f.Command(), f.typ)
}

// Bytes returns the whole frame, size prefix included: what to forward
// when the frame is relayed unchanged.
func (f Frame) Bytes() []byte { return f.b }

// Len returns the frame's length, size prefix included.
func (f Frame) Len() int { return len(f.b) }

// TotalSize returns the frame's totalSize field (Len() - 4).
func (f Frame) TotalSize() int { return len(f.b) - 4 }

// CommandSize returns the length of the BaseCommand.
func (f Frame) CommandSize() int { return int(binary.BigEndian.Uint32(f.b[4:])) }

// Type returns BaseCommand.type. Values this package's proto does not name
// are returned as they are.
func (f Frame) Type() pulsarpb.BaseCommand_Type { return f.typ }

// Command returns the encoded BaseCommand; see DecodeCommand.
func (f Frame) Command() []byte { return f.b[frameHeaderLen : frameHeaderLen+f.CommandSize()] }

// HasPayload reports whether bytes follow the BaseCommand (SEND, MESSAGE).
func (f Frame) HasPayload() bool { return f.mdOff != 0 }

// HeadersAndPayload returns everything after the BaseCommand: empty for a
// simple frame.
func (f Frame) HeadersAndPayload() []byte { return f.b[frameHeaderLen+f.CommandSize():] }

// HasBrokerEntryMetadata reports whether a 0x0e02 block is present.
func (f Frame) HasBrokerEntryMetadata() bool { return f.bemOff != 0 }

// BrokerEntryMetadataOffset returns the offset in Bytes() of the encoded
// BrokerEntryMetadata, or 0 when absent.
func (f Frame) BrokerEntryMetadataOffset() int { return int(f.bemOff) }

// BrokerEntryMetadata returns the encoded BrokerEntryMetadata, nil when
// absent.
func (f Frame) BrokerEntryMetadata() []byte {
	if f.bemOff == 0 {
		return nil
	}
	size := binary.BigEndian.Uint32(f.b[f.bemOff-4:])
	return f.b[f.bemOff : f.bemOff+size]
}

// HasChecksum reports whether a 0x0e01 checksum block is present.
func (f Frame) HasChecksum() bool { return f.crcOff != 0 }

// ChecksumOffset returns the offset in Bytes() of the 4 checksum bytes, or 0
// when absent.
func (f Frame) ChecksumOffset() int { return int(f.crcOff) }

// Checksum returns the CRC32C the frame carries (0 when absent).
func (f Frame) Checksum() uint32 {
	if f.crcOff == 0 {
		return 0
	}
	return binary.BigEndian.Uint32(f.b[f.crcOff:])
}

// MetadataOffset returns the offset in Bytes() of the MessageMetadata, or 0
// for a simple frame. The 4-byte metadata size sits just before it.
func (f Frame) MetadataOffset() int { return int(f.mdOff) }

// MetadataSize returns the length of the MessageMetadata.
func (f Frame) MetadataSize() int { return int(f.payloadOff - f.mdOff) }

// Metadata returns the encoded MessageMetadata, nil for a simple frame.
func (f Frame) Metadata() []byte {
	if f.mdOff == 0 {
		return nil
	}
	return f.b[f.mdOff:f.payloadOff]
}

// PayloadOffset returns the offset in Bytes() of the payload, or 0 for a
// simple frame.
func (f Frame) PayloadOffset() int { return int(f.payloadOff) }

// Payload returns the payload (possibly compressed, possibly a batch), nil
// for a simple frame.
func (f Frame) Payload() []byte {
	if f.mdOff == 0 {
		return nil
	}
	return f.b[f.payloadOff:]
}

// ChecksummedBytes returns what the CRC32C covers:
// [metadataSize][metadata][payload]. Nil for a simple frame.
func (f Frame) ChecksummedBytes() []byte {
	if f.mdOff == 0 {
		return nil
	}
	return f.b[f.mdOff-4:]
}

// VerifyChecksum checks the frame's CRC32C. It returns ErrNotPayloadFrame
// for a simple frame, ErrNoChecksum when the block is absent and
// ErrChecksum on a mismatch.
func (f Frame) VerifyChecksum() error {
	switch {
	case f.mdOff == 0:
		return ErrNotPayloadFrame
	case f.crcOff == 0:
		return ErrNoChecksum
	case binary.BigEndian.Uint32(f.b[f.crcOff:]) != CRC32C(f.b[f.mdOff-4:]): // Checksum and the CRC of ChecksummedBytes, inline: it runs per send
		return ErrChecksum
	}
	return nil
}
