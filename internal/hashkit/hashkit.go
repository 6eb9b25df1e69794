// Package hashkit provides twemproxy's key hash functions, bit for bit, under twemproxy's
// configuration names, so moxi places keys on the same servers as nutcracker 0.5.0.
//
// Several of them reproduce quirks of twemproxy's C code rather than the published
// algorithm: bytes are read as signed char and sign-extended where twemproxy does so,
// fnv1a_64 is computed in 32 bits, crc32 keeps only 15 bits, crc16 does not truncate to
// 16 bits. Changing any of them would move keys relative to a twemproxy cluster.
package hashkit

import (
	"crypto/md5"
	"encoding/binary"
	"sort"
)

// Func hashes a key to 32 bits. The functions of this package are pure, safe for
// concurrent use, keep no reference to key and do not allocate.
type Func func(key []byte) uint32

// funcs maps twemproxy's hash names (the "hash:" setting of nutcracker.yml) to the
// functions; it is never written after initialisation.
var funcs = map[string]Func{
	"one_at_a_time": OneAtATime,
	"md5":           MD5,
	"crc16":         CRC16,
	"crc32":         CRC32,
	"crc32a":        CRC32a,
	"fnv1_64":       FNV1_64,
	"fnv1a_64":      FNV1a_64,
	"fnv1_32":       FNV1_32,
	"fnv1a_32":      FNV1a_32,
	"hsieh":         Hsieh,
	"murmur":        Murmur,
	"jenkins":       Jenkins,
}

// Lookup returns the hash function twemproxy calls name, and false if there is none.
func Lookup(name string) (Func, bool) {
	f, ok := funcs[name]
	return f, ok
}

// Names returns twemproxy's hash names in sorted order, in a new slice.
func Names() []string {
	names := make([]string, 0, len(funcs))
	for n := range funcs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// signed returns b the way twemproxy reads a byte of a key through a (signed) char and
// converts it to uint32: bytes of 0x80 and above are sign-extended.
func signed(b byte) uint32 { return uint32(int32(int8(b))) }

// MD5 is twemproxy's md5: the first four bytes of the key's MD5 digest, little-endian.
func MD5(key []byte) uint32 {
	sum := md5.Sum(key)
	return binary.LittleEndian.Uint32(sum[:4])
}

// OneAtATime is twemproxy's one_at_a_time (Bob Jenkins' one-at-a-time hash over signed
// bytes).
func OneAtATime(key []byte) uint32 {
	var h uint32
	for _, b := range key {
		h += signed(b)
		h += h << 10
		h ^= h >> 6
	}
	h += h << 3
	h ^= h >> 11
	h += h << 15
	return h
}
