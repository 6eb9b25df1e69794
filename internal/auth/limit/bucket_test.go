package limit

import (
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// takeAll takes one token at a time until the bucket refuses, and returns how many it gave.
func takeAll(b *Bucket) int {
	n := 0
	for b.Take(1) {
		n++
	}
	return n
}

func TestBucket(t *testing.T) {
	for _, tt := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"a burst of one second, then the rate", func(t *testing.T) {
			b := NewBucket(1000)
			if n := takeAll(b); n != 1000 {
				t.Errorf("a full bucket gave %d, want 1000", n)
			}
			time.Sleep(time.Millisecond)
			if n := takeAll(b); n != 1 {
				t.Errorf("1 ms later: %d, want 1", n)
			}
			time.Sleep(10 * time.Second) // holds one second's worth, not ten
			if n := takeAll(b); n != 1000 {
				t.Errorf("10 s later: %d, want 1000", n)
			}
			given := 0
			for range 500 {
				time.Sleep(time.Millisecond)
				given += takeAll(b)
			}
			if given != 500 {
				t.Errorf("over 500 ms: %d, want 500", given)
			}
		}},
		{"all or none", func(t *testing.T) {
			b := NewBucket(10)
			if !b.Take(8) {
				t.Fatal("8 of 10 refused")
			}
			if b.Take(5) {
				t.Error("5 given with 2 left")
			}
			if !b.Take(2) {
				t.Error("2 refused with 2 left: a refusal took tokens")
			}
		}},
		{"more than a burst passes when full, then is owed", func(t *testing.T) {
			b := NewBucket(10)
			if !b.Take(25) {
				t.Fatal("a full bucket refused 25 (2.5 s worth): it would never pass")
			}
			if b.Take(25) {
				t.Error("25 given again at once")
			}
			// The next token comes once the 2.5 s taken, less the second a bucket holds, and
			// the token's 0.1 s have passed: at 1.6 s.
			time.Sleep(1590 * time.Millisecond)
			if b.Take(1) {
				t.Errorf("a token given 1.59 s after 2.5 s worth (holds %.2f)", b.Tokens())
			}
			time.Sleep(10 * time.Millisecond)
			if !b.Take(1) {
				t.Errorf("no token 1.6 s after 2.5 s worth (holds %.2f)", b.Tokens())
			}
		}},
		{"a debt is repaid before tokens are given", func(t *testing.T) {
			b := NewBucket(100)
			b.Owe(300)
			if got := b.Tokens(); got != -200 {
				t.Errorf("holds %v after owing 300 of 100, want -200", got)
			}
			time.Sleep(2 * time.Second)
			if b.Take(1) {
				t.Error("a token given while the debt is not repaid")
			}
			time.Sleep(10 * time.Millisecond)
			if !b.Take(1) {
				t.Error("no token once the debt is repaid")
			}
		}},
		{"given back", func(t *testing.T) {
			b := NewBucket(10)
			b.Take(10)
			b.Give(4)
			if n := takeAll(b); n != 4 {
				t.Errorf("%d after 4 given back, want 4", n)
			}
		}},
		{"rates past a billion a second count", func(t *testing.T) {
			b := NewBucket(4e9)
			if !b.Take(1) || b.Tokens() >= 4e9 {
				t.Errorf("a token of 4e9/s: holds %v", b.Tokens())
			}
		}},
		{"shared by many goroutines", func(t *testing.T) {
			b := NewBucket(1000)
			var given atomic.Int64
			var wg sync.WaitGroup
			for range 16 {
				wg.Go(func() {
					for range 200 {
						if b.Take(1) {
							given.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if given.Load() != 1000 {
				t.Errorf("16 goroutines took %d of a full bucket of 1000", given.Load())
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) { synctest.Test(t, tt.run) })
	}
}

func TestUsers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := NewUsers(map[string]Rates{"alice": {Requests: 10}, "bob": {}, Every: {Requests: 5}})
		if !l.Named("alice") || !l.Named("bob") || l.Named("carol") {
			t.Error("Named")
		}
		if l.For("bob") != nil {
			t.Error("bob, named without rates, is limited")
		}
		alice, carol, dave := l.For("alice"), l.For("carol"), l.For("dave")
		if carol == nil || carol == dave || l.For("carol") != carol {
			t.Fatal(`"*": each other user has a bucket of their own, the same at each look-up`)
		}
		if !alice.Take(10, 0) || alice.Take(1, 0) {
			t.Error("alice: 10 a second")
		}
		if !carol.Take(5, 0) || carol.Take(1, 0) || !dave.Take(5, 0) {
			t.Error(`carol and dave: 5 a second each`)
		}
		if (*Users)(nil).For("alice") != nil || NewUsers(map[string]Rates{"alice": {Requests: 1}}).For("carol") != nil {
			t.Error("a user without rates, named or by *, is limited")
		}

		// A reload: alice's and carol's rates unchanged (carol now named), dave's changed;
		// erin left the users file.
		l.For("erin")
		next := NewUsers(map[string]Rates{"alice": {Requests: 10}, "carol": {Requests: 5}, Every: {Requests: 6}})
		next.Keep(l, func(u string) bool { return u != "erin" })
		if next.For("alice") != alice || next.For("carol") != carol {
			t.Error("the buckets of unchanged rates were not kept")
		}
		if d := next.For("dave"); d == dave || !d.Take(6, 0) {
			t.Error("dave's new rate: a new, full bucket")
		}
		if next.other("erin") != nil {
			t.Error("erin's bucket kept after erin left the users file")
		}
		if next.For("alice").Take(1, 0) {
			t.Error("alice's kept bucket was refilled")
		}
	})
}

func TestUserBothOrNeither(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := newUser(Rates{Requests: 10, Bytes: 100})
		if u.Take(1, 200) == false {
			t.Fatal("a full bytes bucket refused 2 s worth")
		}
		if u.Take(1, 1) {
			t.Error("bytes owed, yet a request passed")
		}
		if got := u.requests.Tokens(); got != 9 {
			t.Errorf("a refused request took a request token: %v left, want 9", got)
		}
		u.Owe(50)
		if !u.LimitsBytes() || (*User)(nil).LimitsBytes() {
			t.Error("LimitsBytes")
		}
	})
}

// TestBucketDebtBounded: debts past any use add up without overflow: the bucket stays
// empty.
func TestBucketDebtBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := NewBucket(1)
		for range 100 {
			b.Owe(1 << 62)
		}
		time.Sleep(time.Hour)
		if b.Take(1) {
			t.Errorf("a token given while owing centuries (holds %v)", b.Tokens())
		}
	})
}
