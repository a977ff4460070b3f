package wire

import "errors"

// ErrIncomplete means the buffer ends inside a frame: the caller should read
// more bytes and call again with the same buffer start. It is the only
// error after which the stream can continue.
var ErrIncomplete = errors.New("wire: incomplete frame")

// ErrFrameTooLarge means a frame's size prefix exceeds the limit
// (totalSize+4 > maxMessageSize+FramePadding), the same rule brokers and
// clients enforce. It is reported as soon as the 4-byte prefix is visible,
// before the body arrives, so a hostile peer cannot make the proxy buffer
// it. A length-prefixed stream cannot be resynchronised: close the
// connection.
var ErrFrameTooLarge = errors.New("wire: frame too large")

// ErrCorruptFrame means the frame's sizes or magic numbers are inconsistent,
// or its BaseCommand is malformed or has no type. The stream is no longer
// trustworthy: close the connection.
var ErrCorruptFrame = errors.New("wire: corrupt frame")

// ErrChecksum means a payload frame's CRC32C does not match its metadata
// and payload. The frame boundaries are still valid; a broker answers such
// a SEND with SendError(ChecksumError).
var ErrChecksum = errors.New("wire: checksum mismatch")

// ErrNoChecksum means a payload frame carries no 0x0e01 checksum block.
// Java brokers tolerate that on SEND; the Go client refuses it on MESSAGE.
var ErrNoChecksum = errors.New("wire: frame has no checksum")

// ErrNotPayloadFrame means an operation that needs metadata and payload was
// given a simple command frame.
var ErrNotPayloadFrame = errors.New("wire: not a payload frame")

// ErrMalformedMetadata means a MessageMetadata or SingleMessageMetadata
// block is not valid protobuf.
var ErrMalformedMetadata = errors.New("wire: malformed metadata")

// ErrMalformedCommand means a BaseCommand or sub-command is not valid
// protobuf, or lacks the sub-command its type names.
var ErrMalformedCommand = errors.New("wire: malformed command")
