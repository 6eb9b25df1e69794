package keyhash

import (
	"fmt"
	"testing"
)

// TestStableNeverChanges: proxies of one tier, and one proxy across restarts, must agree
// on Stable (a shadow pool gets the same share of keys from each), so its values are
// pinned.
func TestStableNeverChanges(t *testing.T) {
	tests := []struct {
		key  string
		want uint64
	}{
		{"", 0xb5edb817f50dd628},
		{"k0", 0x177e789b6801e412},
		{"user:42", 0x22378e15fa4dae88},
		{"a", 0xc50f4496ebbbe86d},
	}
	for _, tt := range tests {
		if got := Stable("moxi/shadow:", []byte(tt.key)); got != tt.want {
			t.Errorf("Stable(%q) = %#x, want %#x", tt.key, got, tt.want)
		}
	}
}

func TestStripesSpreadKeys(t *testing.T) {
	var s Stripes[int]
	const keys = 100_000
	for i := range keys {
		k := []byte(fmt.Sprint("key:", i))
		*s.Of(k)++
		if s.Of(k) != &s[Stripe(k, len(s))] {
			t.Fatalf("Of and Stripe disagree on %s", k)
		}
	}
	mean := keys / len(s)
	for i, n := range s {
		if n < mean/2 || n > mean*2 {
			t.Fatalf("stripe %d holds %d keys; the mean is %d", i, n, mean)
		}
	}
}

func BenchmarkStripe(b *testing.B) {
	key := []byte("user:1234567:profile")
	b.ReportAllocs()
	for b.Loop() {
		_ = Stripe(key, 1024)
	}
}
