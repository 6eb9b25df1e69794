package memstore

import (
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

func TestExpiry(t *testing.T) {
	now := start.Unix()
	const day = 24 * time.Hour
	cases := []struct {
		name    string
		exptime int64
		alive   time.Duration // still a hit this long after the set (ignored when dead)
		dead    time.Duration // a miss this long after the set
		never   bool          // expired at once: a miss right away
	}{
		{name: "zero never expires", exptime: 0, alive: 3650 * day, dead: -1},
		{name: "relative", exptime: 10, alive: 9 * time.Second, dead: 10 * time.Second},
		{name: "thirty days is still relative", exptime: 2592000, alive: 30*day - time.Second, dead: 30 * day},
		{name: "over thirty days is absolute", exptime: now + 100, alive: 99 * time.Second, dead: 100 * time.Second},
		{name: "absolute in the past", exptime: now - 1, never: true},
		{name: "just over thirty days is an absolute time long past", exptime: 2592001, never: true},
		{name: "negative", exptime: -1, never: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, c := newTestStore(0)
			set(t, s, "k", "v", 0, tc.exptime)
			if tc.never {
				wantMiss(t, s, "k")
				return
			}
			c.advance(tc.alive)
			wantHit(t, s, "k", "v")
			if tc.dead < 0 {
				return
			}
			c.t = start.Add(tc.dead)
			wantMiss(t, s, "k")
			if got := stat(t, s, "curr_items"); got != "0" {
				t.Errorf("curr_items %s after an expired get, want 0", got)
			}
		})
	}
}

// TestExpiryUpdates checks which commands change an item's exptime and which keep it.
func TestExpiryUpdates(t *testing.T) {
	k := []byte("k")
	cases := []struct {
		name   string
		req    protocol.Request
		value  string
		expiry time.Duration // when the item, set with exptime 10, now expires
	}{
		{"touch extends", protocol.Request{Op: protocol.OpTouch, Key: k, Exptime: 100}, "5", 100 * time.Second},
		{"touch to never", protocol.Request{Op: protocol.OpTouch, Key: k}, "5", -1},
		{"gat extends", protocol.Request{Op: protocol.OpGat, Keys: [][]byte{k}, Exptime: 100}, "5", 100 * time.Second},
		{"gats extends", protocol.Request{Op: protocol.OpGats, Keys: [][]byte{k}, Exptime: 100}, "5", 100 * time.Second},
		{"set replaces", protocol.Request{Op: protocol.OpSet, Key: k, Value: []byte("6"), Exptime: 100}, "6", 100 * time.Second},
		{"append keeps", protocol.Request{Op: protocol.OpAppend, Key: k, Value: []byte("6")}, "56", 10 * time.Second},
		{"prepend keeps", protocol.Request{Op: protocol.OpPrepend, Key: k, Value: []byte("6")}, "65", 10 * time.Second},
		{"incr keeps", protocol.Request{Op: protocol.OpIncr, Key: k, Delta: 1}, "6", 10 * time.Second},
		{"get keeps", protocol.Request{Op: protocol.OpGet, Keys: [][]byte{k}}, "5", 10 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, c := newTestStore(0)
			set(t, s, "k", "5", 0, 10)
			// Commands are applied 1s after the set, so relative times count from then.
			c.advance(time.Second)
			if r := do(t, s, tc.req); r.Status != protocol.StatusOK {
				t.Fatalf("%v: %v", tc.req.Op, r.Status)
			}
			if tc.expiry < 0 {
				c.advance(3650 * 24 * time.Hour)
				wantHit(t, s, "k", tc.value)
				return
			}
			at := start.Add(tc.expiry)
			if tc.expiry > 10*time.Second {
				at = at.Add(time.Second)
			}
			c.t = at.Add(-time.Second)
			wantHit(t, s, "k", tc.value)
			c.t = at
			wantMiss(t, s, "k")
		})
	}
}

// TestGatIntoThePast checks memcached's order: the value is returned, then the item is gone.
func TestGatIntoThePast(t *testing.T) {
	s, _ := newTestStore(0)
	set(t, s, "k", "v", 0, 0)
	r := do(t, s, protocol.Request{Op: protocol.OpGat, Keys: [][]byte{[]byte("k")}, Exptime: -1})
	if r.Status != protocol.StatusOK || string(r.Value) != "v" {
		t.Fatalf("gat = %v %q, want the value", r.Status, r.Value)
	}
	wantMiss(t, s, "k")
}

// TestSetExpiredReplaces checks that storing an already expired item hides the old one.
func TestSetExpiredReplaces(t *testing.T) {
	s, _ := newTestStore(0)
	set(t, s, "k", "old", 0, 0)
	set(t, s, "k", "new", 0, -1)
	wantMiss(t, s, "k")
	if got := stat(t, s, "bytes"); got != "0" {
		t.Errorf("bytes %s, want 0", got)
	}
}

func TestFlushAll(t *testing.T) {
	flush := func(t *testing.T, s *Store, delay int64) {
		t.Helper()
		if r := do(t, s, protocol.Request{Op: protocol.OpFlushAll, Exptime: delay}); r.Status != protocol.StatusOK {
			t.Fatalf("flush_all: %v", r.Status)
		}
	}
	t.Run("now", func(t *testing.T) {
		s, _ := newTestStore(0)
		set(t, s, "a", "1", 0, 0)
		flush(t, s, 0)
		wantMiss(t, s, "a")
		set(t, s, "b", "2", 0, 0) // same second as the flush: stored after it, so it stays
		wantHit(t, s, "b", "2")
	})
	t.Run("negative delay is now", func(t *testing.T) {
		s, _ := newTestStore(0)
		set(t, s, "a", "1", 0, 0)
		flush(t, s, -5)
		wantMiss(t, s, "a")
	})
	t.Run("delayed", func(t *testing.T) {
		s, c := newTestStore(0)
		set(t, s, "a", "1", 0, 0)
		flush(t, s, 10)
		c.advance(5 * time.Second)
		set(t, s, "b", "2", 0, 0)
		c.advance(4 * time.Second)
		wantHit(t, s, "a", "1")
		wantHit(t, s, "b", "2")
		c.advance(time.Second)
		set(t, s, "c", "3", 0, 0) // stored at the flush time: after it
		wantMiss(t, s, "a")
		wantMiss(t, s, "b")
		wantHit(t, s, "c", "3")
		c.advance(time.Hour)
		wantHit(t, s, "c", "3")
	})
	t.Run("delayed shows in stats without a request", func(t *testing.T) {
		s, c := newTestStore(0)
		set(t, s, "a", "1", 0, 0)
		flush(t, s, 10)
		c.advance(10 * time.Second)
		if got := stat(t, s, "curr_items"); got != "0" {
			t.Errorf("curr_items %s, want 0", got)
		}
	})
	t.Run("absolute time", func(t *testing.T) {
		s, c := newTestStore(0)
		set(t, s, "a", "1", 0, 0)
		flush(t, s, start.Unix()+100)
		c.advance(99 * time.Second)
		wantHit(t, s, "a", "1")
		c.advance(time.Second)
		wantMiss(t, s, "a")
	})
	t.Run("absolute time in the past is now", func(t *testing.T) {
		s, _ := newTestStore(0)
		set(t, s, "a", "1", 0, 0)
		flush(t, s, start.Unix()-100)
		wantMiss(t, s, "a")
	})
	t.Run("a later flush replaces a pending one", func(t *testing.T) {
		s, c := newTestStore(0)
		set(t, s, "a", "1", 0, 0)
		flush(t, s, 10)
		flush(t, s, 100)
		c.advance(99 * time.Second)
		wantHit(t, s, "a", "1")
		c.advance(time.Second)
		wantMiss(t, s, "a")
	})
	t.Run("an immediate flush cancels a pending one", func(t *testing.T) {
		s, c := newTestStore(0)
		flush(t, s, 10)
		flush(t, s, 0)
		set(t, s, "a", "1", 0, 0)
		c.advance(time.Hour)
		wantHit(t, s, "a", "1")
	})
}
