// Package limit holds how many requests and bytes a second each user may send: a token
// bucket per user and per kind, refilled at the user's rate and holding one second's worth.
package limit

import (
	"sync/atomic"
	"time"
)

// Burst is what a full bucket holds: one second's worth of its rate.
const Burst = time.Second

// Bucket is a token bucket of rate tokens a second holding at most Burst's worth. It keeps
// one word, the instant at which it will be full again (the generic cell rate algorithm),
// so that every connection of a user takes from it with a compare-and-swap, no lock.
//
// A Bucket is safe for concurrent use. It is made full, and reads the clock with
// time.Since, so testing/synctest's clock drives it.
type Bucket struct {
	perToken float64   // nanoseconds a token takes to come back; read-only
	epoch    time.Time // instants are nanoseconds since; read-only
	// full is the instant (since epoch) at which the bucket is full again: at or before
	// now it is full; past now+Burst it owes more than it can hold (Owe).
	full atomic.Int64
}

// NewBucket makes a full bucket of rate tokens a second; rate must be positive.
func NewBucket(rate int64) *Bucket {
	return &Bucket{perToken: float64(time.Second) / float64(rate), epoch: time.Now()}
}

// cost is the time n tokens take to come back, at least a nanosecond for n > 0 (so a
// rate past a billion a second gives single tokens a billion a second).
func (b *Bucket) cost(n int64) int64 {
	if n <= 0 {
		return 0
	}
	c := float64(n) * b.perToken
	if c >= float64(maxAhead) {
		return maxAhead // owed for a century: refused as surely, and no overflow
	}
	return max(int64(c+0.5), 1)
}

// maxAhead bounds how far past now a bucket's full instant goes, whatever it owes, so
// that debts added up never overflow.
const maxAhead = int64(100 * 365 * 24 * time.Hour)

func (b *Bucket) now() int64 { return int64(time.Since(b.epoch)) }

// Take takes n tokens when the bucket holds them, or none (all or none) and reports false.
// A full bucket gives any n, even more than it holds, and owes the rest: a request larger
// than a second's worth passes once the bucket has refilled, rather than never.
func (b *Bucket) Take(n int64) bool { return b.take(n, time.Now()) }

// take is Take at the instant t, so that a User reads the clock once for its two buckets.
func (b *Bucket) take(n int64, t time.Time) bool {
	c := b.cost(n)
	now := int64(t.Sub(b.epoch))
	for {
		full := b.full.Load()
		from := max(full, now)
		if full > now && from+c-now > int64(Burst) {
			return false
		}
		if b.full.CompareAndSwap(full, from+c) {
			return true
		}
	}
}

// Owe takes n tokens whether the bucket holds them or not: what it lacks is owed, and
// Take gives nothing until the debt is repaid at the bucket's rate.
func (b *Bucket) Owe(n int64) {
	c := b.cost(n)
	if c == 0 {
		return
	}
	now := b.now()
	for {
		full := b.full.Load()
		if b.full.CompareAndSwap(full, min(max(full, now)+c, now+maxAhead)) {
			return
		}
	}
}

// Give puts back n tokens that Take took, when what took them was refused after all.
func (b *Bucket) Give(n int64) { b.full.Add(-b.cost(n)) }

// Tokens is what the bucket holds now, negative when it owes; for tests and reports.
func (b *Bucket) Tokens() float64 {
	full := b.full.Load()
	now := b.now()
	if full <= now {
		return float64(Burst) / b.perToken
	}
	return float64(int64(Burst)-(full-now)) / b.perToken
}
