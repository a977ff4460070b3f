// Package wire reads and writes Pulsar binary-protocol frames.
//
// It is the proxy's only parser of the byte stream. The hot path is
// ReadFrame: given a buffer that may hold a partial frame or many frames, it
// returns a Frame, a small value holding offsets into the buffer (command
// type, optional broker-entry-metadata block, checksum, metadata, payload),
// and the number of bytes consumed. It reads BaseCommand.type with a
// hand-written scan and does not allocate. Anything more is done only on
// request:
//
//   - DecodeCommand decodes the full BaseCommand (generated code, package
//     pulsarpb); ParseSend and ParseSendReceipt read the two commands of
//     the producer hot path without allocating.
//   - DecodeMetadata / AppendMetadata and the Set* stamping helpers edit a
//     MessageMetadata; AppendRestampedFrame and AppendSendFrameMetadata
//     write the frame again with the payload bytes unchanged and a fresh
//     CRC32C. A Stamp applies the same edits to the encoded metadata
//     without decoding it (AppendStampedMetadata, AppendStampedFrame), with
//     no allocation.
//   - The Append*Frame encoders write whole frames to a caller-provided
//     buffer, strconv.Append style.
//   - Subpackages: batch splits and assembles batch payloads, compression
//     implements the payload codecs with bounded decompression, pulsarpb
//     holds the generated protocol types.
//
// Contracts:
//
//   - Frame views alias the caller's buffer and are valid until the caller
//     overwrites it. Forwarding an untouched frame means writing
//     Frame.Bytes(), the original bytes.
//   - Frame size is limited as brokers and clients do: totalSize+4 <=
//     maxMessageSize+FramePadding (maxMessageSize defaults to 5 MiB). The
//     check happens on the 4-byte prefix, before the body is buffered.
//   - Errors are sentinels (ErrIncomplete, ErrFrameTooLarge,
//     ErrCorruptFrame, ErrChecksum, ...), compared with errors.Is. Only
//     ErrIncomplete lets a stream continue.
//   - proto2 required fields are never enforced on decode or encode: the
//     proxy must not reject what a broker would accept. Fields unknown to
//     pulsarpb survive a decode and re-encode.
//   - Concurrency: every function in this package is pure (no package
//     state beyond read-only tables) and safe to call from any goroutine.
//     A Frame and the buffer under it belong to the goroutine that read
//     them, normally the connection's event loop; decoded pulsarpb messages
//     are ordinary Go values, not safe for concurrent mutation.
package wire
