package memstore

import (
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

// TestDelta checks incr and decr against answers recorded from memcached 1.6.18.
func TestDelta(t *testing.T) {
	const (
		incr = protocol.OpIncr
		decr = protocol.OpDecr
	)
	cases := []struct {
		name   string
		stored string // "" with absent set: the key is missing
		absent bool
		op     protocol.Op
		delta  uint64
		want   protocol.Status
		number uint64
		after  string // the stored text afterwards
	}{
		{name: "incr", stored: "10", op: incr, delta: 5, number: 15, after: "15"},
		{name: "incr grows the text", stored: "99", op: incr, delta: 1, number: 100, after: "100"},
		{name: "incr wraps at 2^64", stored: "18446744073709551615", op: incr, delta: 2, number: 1, after: "1                   "},
		{name: "decr", stored: "10", op: decr, delta: 3, number: 7, after: "7 "},
		{name: "decr pads with spaces as memcached rewrites in place", stored: "100", op: decr, delta: 95, number: 5, after: "5  "},
		{name: "decr floors at zero", stored: "12", op: decr, delta: 100, number: 0, after: "0 "},
		{name: "decr by one past the value", stored: "5", op: decr, delta: 6, number: 0, after: "0"},
		{name: "decr to exactly zero", stored: "5", op: decr, delta: 5, number: 0, after: "0"},
		{name: "incr by zero", stored: "7", op: incr, delta: 0, number: 7, after: "7"},
		{name: "20 digits max value", stored: "18446744073709551615", op: decr, delta: 0, number: 18446744073709551615, after: "18446744073709551615"},
		{name: "past 2^64 is not a number", stored: "18446744073709551616", op: incr, delta: 1, want: protocol.StatusNonNumeric, after: "18446744073709551616"},
		{name: "empty is not a number", stored: "", op: incr, delta: 1, want: protocol.StatusNonNumeric, after: ""},
		{name: "letters", stored: "abc", op: incr, delta: 1, want: protocol.StatusNonNumeric, after: "abc"},
		{name: "trailing letters", stored: "12abc", op: decr, delta: 1, want: protocol.StatusNonNumeric, after: "12abc"},
		{name: "hex is not decimal", stored: "0x", op: incr, delta: 1, want: protocol.StatusNonNumeric, after: "0x"},
		{name: "only a space", stored: " ", op: incr, delta: 1, want: protocol.StatusNonNumeric, after: " "},
		{name: "minus one", stored: "-1", op: incr, delta: 1, want: protocol.StatusNonNumeric, after: "-1"},
		{name: "leading space", stored: " 12", op: incr, delta: 1, number: 13, after: "13 "},
		{name: "leading tab", stored: "\t12", op: incr, delta: 1, number: 13, after: "13 "},
		{name: "trailing space", stored: "12 ", op: incr, delta: 1, number: 13, after: "13 "},
		{name: "stops at a space", stored: "1 2", op: incr, delta: 1, number: 2, after: "2  "},
		{name: "plus sign", stored: "+5", op: incr, delta: 1, number: 6, after: "6 "},
		{name: "minus zero", stored: "-0", op: incr, delta: 1, number: 1, after: "1 "},
		{name: "minus wraps as strtoull does", stored: "-18446744073709551615", op: incr, delta: 1, number: 2, after: "2                    "},
		{name: "leading zeros past 20 digits", stored: "0000000000000000000000000000000000000001", op: incr, delta: 1, number: 2, after: "2                                       "},
		{name: "incr missing", absent: true, op: incr, delta: 1, want: protocol.StatusNotFound},
		{name: "decr missing", absent: true, op: decr, delta: 1, want: protocol.StatusNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newTestStore(0)
			if !tc.absent {
				set(t, s, "k", tc.stored, 42, 0)
			}
			r := do(t, s, protocol.Request{Op: tc.op, Key: []byte("k"), Delta: tc.delta})
			if r.Status != tc.want || r.Number != tc.number {
				t.Fatalf("status %v number %d, want %v %d", r.Status, r.Number, tc.want, tc.number)
			}
			if tc.absent {
				wantMiss(t, s, "k")
				return
			}
			if g := wantHit(t, s, "k", tc.after); g.Flags != 42 {
				t.Errorf("flags %d, want 42 kept", g.Flags)
			}
		})
	}
}

// TestDeltaBinary covers the binary protocol's initial value and cas compare.
func TestDeltaBinary(t *testing.T) {
	k := []byte("k")
	t.Run("create stores initial", func(t *testing.T) {
		s, c := newTestStore(0)
		r := do(t, s, protocol.Request{Op: protocol.OpIncr, Key: k, Delta: 5, Initial: 10, Create: true, Exptime: 60, Binary: true})
		if r.Status != protocol.StatusOK || r.Number != 10 || r.Cas == 0 {
			t.Fatalf("got %v %d cas %d, want OK 10 with a cas", r.Status, r.Number, r.Cas)
		}
		if g := wantHit(t, s, "k", "10"); g.Cas != r.Cas || g.Flags != 0 {
			t.Errorf("get cas %d flags %d, want cas %d flags 0", g.Cas, g.Flags, r.Cas)
		}
		r = do(t, s, protocol.Request{Op: protocol.OpDecr, Key: k, Delta: 3, Initial: 10, Create: true, Binary: true})
		if r.Number != 7 {
			t.Errorf("decr on the created key = %d, want 7", r.Number)
		}
		c.advance(60 * time.Second)
		wantMiss(t, s, "k")
	})
	t.Run("no create", func(t *testing.T) {
		s, _ := newTestStore(0)
		r := do(t, s, protocol.Request{Op: protocol.OpDecr, Key: k, Delta: 5, Initial: 10, Binary: true})
		if r.Status != protocol.StatusNotFound {
			t.Fatalf("status %v, want NotFound", r.Status)
		}
		wantMiss(t, s, "k")
	})
	t.Run("cas mismatch", func(t *testing.T) {
		s, _ := newTestStore(0)
		cas := set(t, s, "k", "1", 0, 0).Cas
		r := do(t, s, protocol.Request{Op: protocol.OpIncr, Key: k, Delta: 1, Cas: cas + 1, Binary: true})
		if r.Status != protocol.StatusExists {
			t.Fatalf("status %v, want Exists", r.Status)
		}
		r = do(t, s, protocol.Request{Op: protocol.OpIncr, Key: k, Delta: 1, Cas: cas, Binary: true})
		if r.Status != protocol.StatusOK || r.Number != 2 {
			t.Fatalf("status %v number %d, want OK 2", r.Status, r.Number)
		}
	})
}
