package hashkit

import (
	"encoding/binary"
	"math/bits"
)

// Murmur is twemproxy's murmur: MurmurHash2 with the seed 0xdeadbeef × len(key), as
// libmemcached seeds it.
func Murmur(key []byte) uint32 {
	const m = 0x5bd1e995
	n := uint32(len(key))
	h := 0xdeadbeef*n ^ n
	for len(key) >= 4 {
		k := binary.LittleEndian.Uint32(key)
		k *= m
		k ^= k >> 24
		k *= m
		h *= m
		h ^= k
		key = key[4:]
	}
	switch len(key) {
	case 3:
		h ^= uint32(key[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(key[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(key[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}

// Hsieh is twemproxy's hsieh: Paul Hsieh's SuperFastHash. With three trailing bytes the
// last one is read as a signed char, as twemproxy does.
func Hsieh(key []byte) uint32 {
	if len(key) == 0 {
		return 0
	}
	var h uint32
	for len(key) >= 4 {
		h += uint32(binary.LittleEndian.Uint16(key))
		tmp := uint32(binary.LittleEndian.Uint16(key[2:]))<<11 ^ h
		h = h<<16 ^ tmp
		h += h >> 11
		key = key[4:]
	}
	switch len(key) {
	case 3:
		h += uint32(binary.LittleEndian.Uint16(key))
		h ^= h << 16
		h ^= signed(key[2]) << 18
		h += h >> 11
	case 2:
		h += uint32(binary.LittleEndian.Uint16(key))
		h ^= h << 11
		h += h >> 17
	case 1:
		h += uint32(key[0])
		h ^= h << 10
		h += h >> 1
	}
	h ^= h << 3
	h += h >> 5
	h ^= h << 4
	h += h >> 17
	h ^= h << 25
	h += h >> 6
	return h
}

// Jenkins is twemproxy's jenkins: Bob Jenkins' lookup3 hashlittle with initial value 13.
// twemproxy's C reads aligned keys by words and others by bytes; on a little-endian
// machine both give this value.
func Jenkins(key []byte) uint32 {
	a := 0xdeadbeef + uint32(len(key)) + 13
	b, c := a, a
	if len(key) == 0 {
		return c
	}
	for len(key) > 12 {
		a += binary.LittleEndian.Uint32(key)
		b += binary.LittleEndian.Uint32(key[4:])
		c += binary.LittleEndian.Uint32(key[8:])
		a, b, c = jenkinsMix(a, b, c)
		key = key[12:]
	}
	// The last 1..12 bytes, zero-padded: the same as lookup3's masked word reads.
	var tail [12]byte
	copy(tail[:], key)
	a += binary.LittleEndian.Uint32(tail[:])
	b += binary.LittleEndian.Uint32(tail[4:])
	c += binary.LittleEndian.Uint32(tail[8:])
	return jenkinsFinal(a, b, c)
}

func jenkinsMix(a, b, c uint32) (uint32, uint32, uint32) {
	a -= c
	a ^= bits.RotateLeft32(c, 4)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 6)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 8)
	b += a
	a -= c
	a ^= bits.RotateLeft32(c, 16)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 19)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 4)
	b += a
	return a, b, c
}

func jenkinsFinal(a, b, c uint32) uint32 {
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return c
}
