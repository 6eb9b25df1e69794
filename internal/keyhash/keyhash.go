// Package keyhash hashes keys for moxi's own use: to spread them over stripes, shards and
// workers, or to pick a stable share of them. Placing keys on a ring is another job, done
// with twemproxy's hashes (hashkit).
package keyhash

import "hash/maphash"

// seed is made once per process and never changed: stripes need only agree within one
// process, and a seed a client cannot know keeps it from choosing keys that collide.
var seed = maphash.MakeSeed()

// Sum is key's hash within this process: another process, or a restart, hashes it
// differently (see Stable).
func Sum(key []byte) uint64 { return maphash.Bytes(seed, key) }

// Stripe is which of n stripes key falls in, 0 ≤ Stripe < n.
func Stripe(key []byte, n int) int { return int(Sum(key) % uint64(n)) }

// Stripes is one T for each of 1024 stripes of keys: state kept by stripe is bounded
// however many keys there are, and two keys that share a stripe only share its T. The
// zero value is ready when T's is.
type Stripes[T any] [1024]T

// Of is key's stripe's T.
func (s *Stripes[T]) Of(key []byte) *T { return &s[Stripe(key, len(s))] }

// Stable is a hash of key that every process computes alike, across restarts and
// versions: FNV-1a 64 of salt followed by key, finished with murmur3's fmix64 so that its
// high bits are mixed as well as its low ones. The salt makes it unrelated to other
// hashes of the key (a ring's fnv1a_64 among them).
func Stable(salt string, key []byte) uint64 {
	h := fnv1a(fnv1a(14695981039346656037, salt), key)
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

func fnv1a[B string | []byte](h uint64, b B) uint64 {
	for i := 0; i < len(b); i++ {
		h = (h ^ uint64(b[i])) * 1099511628211
	}
	return h
}

// In is the hash of key within space (a pool's name): Sum, for state that the same key
// name in two spaces must not share.
func In(space string, key []byte) uint64 {
	return maphash.String(seed, space)*0x9e3779b97f4a7c15 ^ maphash.Bytes(seed, key)
}
