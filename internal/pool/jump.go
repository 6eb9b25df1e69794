package pool

import jump "github.com/dgryski/go-jump"

// Jump places keys with Lamping and Veach's jump consistent hash
// (github.com/dgryski/go-jump), weighted by giving each server one bucket per unit of
// weight, in server order. Appending a server of weight w to a total weight W moves only
// the w/(W+w) share of keys that it takes over. It is not twemproxy-compatible. A Jump is
// immutable and safe for concurrent use.
type Jump struct {
	buckets []int32 // buckets[i] is the index of the server owning bucket i
}

// NewJump builds the buckets for servers with these weights. It panics if a weight is not
// positive; configuration loading rejects those first.
func NewJump(weights []int) *Jump {
	return &Jump{buckets: weightedSlots(weights)}
}

// Pick returns the index of the server owning hash, or -1 when there are no servers. It
// does not allocate.
func (j *Jump) Pick(hash uint32) int {
	if len(j.buckets) == 0 {
		return -1
	}
	return int(j.buckets[jump.Hash(uint64(hash), len(j.buckets))])
}

// PickLive is Pick, except that a key whose owner is not alive is rehashed: jump is asked
// again with the hash mixed with 1, 2, … until a live owner comes up, so a dead server's
// keys spread over the others and every other key stays put. -1 when none is alive.
func (j *Jump) PickLive(hash uint32, alive func(server int) bool) int {
	n := len(j.buckets)
	if n == 0 {
		return -1
	}
	key := uint64(hash)
	for attempt := range 4 * n {
		o := int(j.buckets[jump.Hash(key, n)])
		if alive(o) {
			return o
		}
		key = uint64(hash) ^ uint64(attempt+1)*0x9e3779b97f4a7c15
	}
	for _, o := range j.buckets { // every rehash met a dead server: take any live one
		if alive(int(o)) {
			return int(o)
		}
	}
	return -1
}
