package wire

import "hash/crc32"

// castagnoli is built once; hash/crc32 uses the SSE4.2/ARMv8 instructions
// for this polynomial when the CPU has them.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRC32C returns the CRC32C (Castagnoli) of b, the checksum Pulsar frames
// carry over [metadataSize][metadata][payload].
func CRC32C(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// UpdateCRC32C extends crc with b, so a checksum can be computed over
// pieces (for example metadata and payload held in separate buffers).
func UpdateCRC32C(crc uint32, b []byte) uint32 { return crc32.Update(crc, castagnoli, b) }
