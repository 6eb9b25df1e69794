package memstore

import (
	"strings"
	"testing"

	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// TestCommands runs one request against a store prepared by setup and checks its status and
// what key "k" holds afterwards. In a fresh store the first modification gets cas unique 1.
func TestCommands(t *testing.T) {
	const (
		ok        = protocol.StatusOK
		notFound  = protocol.StatusNotFound
		exists    = protocol.StatusExists
		notStored = protocol.StatusNotStored
		tooLarge  = protocol.StatusTooLarge
	)
	k := []byte("k")
	v := func(s string) []byte { return []byte(s) }
	setK := protocol.Request{Op: protocol.OpSet, Key: k, Value: v("a"), Flags: 7}
	big := v(strings.Repeat("x", 1000)) // too large for the 1 KiB store below
	const missing = "\x00missing"

	cases := []struct {
		name  string
		setup []protocol.Request
		req   protocol.Request
		want  protocol.Status
		value string // what get k returns afterwards, or missing
		flags uint32
	}{
		{"set new", nil, protocol.Request{Op: protocol.OpSet, Key: k, Value: v("b"), Flags: 3}, ok, "b", 3},
		{"set overwrites", []protocol.Request{setK}, protocol.Request{Op: protocol.OpSet, Key: k, Value: v("b")}, ok, "b", 0},
		{"set empty value", nil, protocol.Request{Op: protocol.OpSet, Key: k}, ok, "", 0},
		{"set too large deletes the old value", []protocol.Request{setK}, protocol.Request{Op: protocol.OpSet, Key: k, Value: big}, tooLarge, missing, 0},
		{"add missing", nil, protocol.Request{Op: protocol.OpAdd, Key: k, Value: v("b")}, ok, "b", 0},
		{"add present", []protocol.Request{setK}, protocol.Request{Op: protocol.OpAdd, Key: k, Value: v("b")}, notStored, "a", 7},
		{"add present binary", []protocol.Request{setK}, protocol.Request{Op: protocol.OpAdd, Key: k, Value: v("b"), Binary: true}, exists, "a", 7},
		{"add too large keeps the old value", []protocol.Request{setK}, protocol.Request{Op: protocol.OpAdd, Key: k, Value: big}, tooLarge, "a", 7},
		{"add with matching cas is a cas", []protocol.Request{setK}, protocol.Request{Op: protocol.OpAdd, Key: k, Value: v("b"), Cas: 1, Binary: true}, ok, "b", 0},
		{"add with cas on missing", nil, protocol.Request{Op: protocol.OpAdd, Key: k, Value: v("b"), Cas: 1, Binary: true}, notFound, missing, 0},
		{"replace missing", nil, protocol.Request{Op: protocol.OpReplace, Key: k, Value: v("b")}, notStored, missing, 0},
		{"replace missing binary", nil, protocol.Request{Op: protocol.OpReplace, Key: k, Value: v("b"), Binary: true}, notFound, missing, 0},
		{"replace present", []protocol.Request{setK}, protocol.Request{Op: protocol.OpReplace, Key: k, Value: v("b"), Flags: 9}, ok, "b", 9},
		{"replace with cas on missing", nil, protocol.Request{Op: protocol.OpReplace, Key: k, Value: v("b"), Cas: 1, Binary: true}, notFound, missing, 0},
		{"replace with cas mismatch", []protocol.Request{setK}, protocol.Request{Op: protocol.OpReplace, Key: k, Value: v("b"), Cas: 2, Binary: true}, exists, "a", 7},
		{"replace with cas match", []protocol.Request{setK}, protocol.Request{Op: protocol.OpReplace, Key: k, Value: v("b"), Cas: 1, Binary: true}, ok, "b", 0},
		{"append missing", nil, protocol.Request{Op: protocol.OpAppend, Key: k, Value: v("b")}, notStored, missing, 0},
		{"append with cas on missing", nil, protocol.Request{Op: protocol.OpAppend, Key: k, Value: v("b"), Cas: 1, Binary: true}, notStored, missing, 0},
		{"append keeps flags", []protocol.Request{setK}, protocol.Request{Op: protocol.OpAppend, Key: k, Value: v("b"), Flags: 1}, ok, "ab", 7},
		{"prepend keeps flags", []protocol.Request{setK}, protocol.Request{Op: protocol.OpPrepend, Key: k, Value: v("b"), Flags: 1}, ok, "ba", 7},
		{"append with cas mismatch", []protocol.Request{setK}, protocol.Request{Op: protocol.OpAppend, Key: k, Value: v("b"), Cas: 2}, exists, "a", 7},
		{"append with cas match", []protocol.Request{setK}, protocol.Request{Op: protocol.OpAppend, Key: k, Value: v("b"), Cas: 1}, ok, "ab", 7},
		{"append past the memory bound", []protocol.Request{{Op: protocol.OpSet, Key: k, Value: big[:600]}}, protocol.Request{Op: protocol.OpAppend, Key: k, Value: big[:600]}, notStored, string(big[:600]), 0},
		{"append too large", []protocol.Request{setK}, protocol.Request{Op: protocol.OpAppend, Key: k, Value: big}, tooLarge, "a", 7},
		{"cas missing", nil, protocol.Request{Op: protocol.OpCas, Key: k, Value: v("b"), Cas: 1}, notFound, missing, 0},
		{"cas mismatch", []protocol.Request{setK}, protocol.Request{Op: protocol.OpCas, Key: k, Value: v("b"), Cas: 2}, exists, "a", 7},
		{"cas zero never matches", []protocol.Request{setK}, protocol.Request{Op: protocol.OpCas, Key: k, Value: v("b")}, exists, "a", 7},
		{"cas match", []protocol.Request{setK}, protocol.Request{Op: protocol.OpCas, Key: k, Value: v("b"), Flags: 2, Cas: 1}, ok, "b", 2},
		{"cas stale after a set", []protocol.Request{setK, setK}, protocol.Request{Op: protocol.OpCas, Key: k, Value: v("b"), Cas: 1}, exists, "a", 7},
		{"cas too large", []protocol.Request{setK}, protocol.Request{Op: protocol.OpCas, Key: k, Value: big, Cas: 1}, tooLarge, "a", 7},
		{"delete missing", nil, protocol.Request{Op: protocol.OpDelete, Key: k}, notFound, missing, 0},
		{"delete present", []protocol.Request{setK}, protocol.Request{Op: protocol.OpDelete, Key: k}, ok, missing, 0},
		{"delete with cas mismatch", []protocol.Request{setK}, protocol.Request{Op: protocol.OpDelete, Key: k, Cas: 2}, exists, "a", 7},
		{"delete with cas match", []protocol.Request{setK}, protocol.Request{Op: protocol.OpDelete, Key: k, Cas: 1}, ok, missing, 0},
		{"touch missing", nil, protocol.Request{Op: protocol.OpTouch, Key: k, Exptime: 10}, notFound, missing, 0},
		{"touch present", []protocol.Request{setK}, protocol.Request{Op: protocol.OpTouch, Key: k, Exptime: 10}, ok, "a", 7},
		{"touch into the past", []protocol.Request{setK}, protocol.Request{Op: protocol.OpTouch, Key: k, Exptime: -1}, ok, missing, 0},
		{"verbosity", []protocol.Request{setK}, protocol.Request{Op: protocol.OpVerbosity, Level: 1}, ok, "a", 7},
		{"noop", nil, protocol.Request{Op: protocol.OpNoop}, ok, missing, 0},
		{"unknown op", nil, protocol.Request{Op: protocol.OpInvalid}, protocol.StatusUnknownCommand, missing, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newTestStore(1024)
			for _, req := range tc.setup {
				if r := do(t, s, req); r.Status != ok {
					t.Fatalf("setup %v: status %v", req.Op, r.Status)
				}
			}
			r := do(t, s, tc.req)
			if r.Status != tc.want {
				t.Fatalf("status %v, want %v", r.Status, tc.want)
			}
			if r.Status == ok && tc.req.Op.IsStorage() && r.Cas == 0 {
				t.Errorf("stored without a cas unique in the answer")
			}
			if tc.value == missing {
				wantMiss(t, s, "k")
				return
			}
			if g := wantHit(t, s, "k", tc.value); g.Flags != tc.flags {
				t.Errorf("flags %d, want %d", g.Flags, tc.flags)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	s, _ := newTestStore(0)
	r := do(t, s, protocol.Request{Op: protocol.OpVersion})
	if r.Status != protocol.StatusOK || string(r.Value) != "moxi-embedded" {
		t.Fatalf("version = %v %q", r.Status, r.Value)
	}
}

// TestCasUniques checks that every modification gets a new cas unique, that every kind of
// retrieval reports it, and that a touch leaves it alone, as memcached does.
func TestCasUniques(t *testing.T) {
	s, _ := newTestStore(0)
	k := []byte("k")
	seen := map[uint64]string{}
	last := uint64(0)
	modify := []protocol.Request{
		{Op: protocol.OpSet, Key: k, Value: []byte("1")},
		{Op: protocol.OpSet, Key: k, Value: []byte("1")},
		{Op: protocol.OpReplace, Key: k, Value: []byte("2")},
		{Op: protocol.OpAppend, Key: k, Value: []byte("3")},
		{Op: protocol.OpPrepend, Key: k, Value: []byte("4")},
		{Op: protocol.OpIncr, Key: k, Delta: 1},
		{Op: protocol.OpDecr, Key: k, Delta: 1},
	}
	for _, req := range modify {
		r := do(t, s, req)
		if r.Status != protocol.StatusOK {
			t.Fatalf("%v: status %v", req.Op, r.Status)
		}
		g := get(t, s, "k")
		if g.Cas != r.Cas {
			t.Errorf("%v answered cas %d, get says %d", req.Op, r.Cas, g.Cas)
		}
		if prev, dup := seen[g.Cas]; dup || g.Cas <= last {
			t.Errorf("%v: cas %d not new (last %d, seen after %s)", req.Op, g.Cas, last, prev)
		}
		seen[g.Cas], last = req.Op.String(), g.Cas
	}
	if r := do(t, s, protocol.Request{Op: protocol.OpTouch, Key: k, Exptime: 100}); r.Status != protocol.StatusOK {
		t.Fatalf("touch: %v", r.Status)
	}
	for _, op := range []protocol.Op{protocol.OpGet, protocol.OpGets, protocol.OpGat, protocol.OpGats} {
		r := do(t, s, protocol.Request{Op: op, Keys: [][]byte{k}, Exptime: 100})
		if r.Status != protocol.StatusOK || r.Cas != last {
			t.Errorf("%v: status %v cas %d, want cas %d", op, r.Status, r.Cas, last)
		}
	}
}

func TestMultiGet(t *testing.T) {
	s, _ := newTestStore(0)
	set(t, s, "a", "1", 1, 0)
	set(t, s, "c", "3", 3, 0)
	req := protocol.Request{Op: protocol.OpGet, Keys: [][]byte{[]byte("a"), []byte("b"), []byte("c"), []byte("a")}}
	resps := make([]protocol.Response, len(req.Keys))
	if err := pool.Do(t.Context(), s, nil, &req, resps); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		key, value string
		status     protocol.Status
		flags      uint32
	}{{"a", "1", protocol.StatusOK, 1}, {"b", "", protocol.StatusNotFound, 0}, {"c", "3", protocol.StatusOK, 3}, {"a", "1", protocol.StatusOK, 1}}
	for i, w := range want {
		r := resps[i]
		if string(r.Key) != w.key || r.Status != w.status || string(r.Value) != w.value || r.Flags != w.flags {
			t.Errorf("resps[%d] = key %q status %v value %q flags %d, want %+v", i, r.Key, r.Status, r.Value, r.Flags, w)
		}
	}
}

// TestOwnership checks that the store copies what it keeps and never changes what it gave.
func TestOwnership(t *testing.T) {
	s, _ := newTestStore(0)
	key, value := []byte("k"), []byte("12")
	do(t, s, protocol.Request{Op: protocol.OpSet, Key: key, Value: value})
	key[0], value[0] = 'x', '9'
	held := wantHit(t, s, "k", "12").Value
	for _, req := range []protocol.Request{
		{Op: protocol.OpAppend, Key: []byte("k"), Value: []byte("3")},
		{Op: protocol.OpPrepend, Key: []byte("k"), Value: []byte("0")},
		{Op: protocol.OpIncr, Key: []byte("k"), Delta: 1},
		{Op: protocol.OpDecr, Key: []byte("k"), Delta: 1000},
		{Op: protocol.OpSet, Key: []byte("k"), Value: []byte("zz")},
	} {
		if r := do(t, s, req); r.Status != protocol.StatusOK {
			t.Fatalf("%v: %v", req.Op, r.Status)
		}
		if string(held) != "12" {
			t.Fatalf("after %v a value handed out earlier changed to %q", req.Op, held)
		}
	}
}
