package route

import (
	"encoding/binary"
	"math/bits"
)

// Murmur3 constants of the x86 32-bit variant (Austin Appleby's public-domain
// reference). They are part of the function's definition, so they never change.
const (
	murmurC1 = 0xcc9e2d51
	murmurC2 = 0x1b873593
)

// Murmur3x86_32 returns MurmurHash3 x86_32 of data with the given seed.
//
// The broker and the Java and Go clients all hash sticky keys with seed 0
// (pulsar-common Murmur3_32Hash; pulsar-client-go uses spaolacci/murmur3), and
// the tests check this function against spaolacci/murmur3 for many inputs.
// It does not allocate. Any goroutine may call it.
func Murmur3x86_32(data []byte, seed uint32) uint32 {
	h := seed
	n := len(data)
	i := 0
	for ; i+4 <= n; i += 4 {
		h ^= murmurMixK(binary.LittleEndian.Uint32(data[i:]))
		h = bits.RotateLeft32(h, 13)
		h = h*5 + 0xe6546b64
	}
	// The tail is read little-endian too: byte i is the lowest byte.
	var k uint32
	switch n & 3 {
	case 3:
		k ^= uint32(data[i+2]) << 16
		fallthrough
	case 2:
		k ^= uint32(data[i+1]) << 8
		fallthrough
	case 1:
		k ^= uint32(data[i])
		h ^= murmurMixK(k)
	}
	h ^= uint32(n)
	return murmurFinalMix(h)
}

func murmurMixK(k uint32) uint32 {
	k *= murmurC1
	k = bits.RotateLeft32(k, 15)
	return k * murmurC2
}

// murmurFinalMix is Murmur3's fmix32: it makes every input bit affect every
// output bit, which is why the low 16 bits alone are a usable hash.
func murmurFinalMix(h uint32) uint32 {
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}
