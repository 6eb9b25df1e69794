package memstore

import (
	"context"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// start is the fake clock's origin: a real unix time, so that absolute exptimes (over 30
// days) are meaningful.
var start = time.Unix(1_700_000_000, 0)

// clock is a manual clock; the store reads it under its own mutex, and tests move it between
// requests, never concurrently with them.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }

func newTestStore(maxBytes int64) (*Store, *clock) {
	c := &clock{t: start}
	return New(Options{MaxBytes: maxBytes, Now: c.now}), c
}

// do runs a single-key request and returns its answer.
func do(t *testing.T, s *Store, req protocol.Request) protocol.Response {
	t.Helper()
	resps := make([]protocol.Response, 1)
	if err := pool.Do(context.Background(), s, nil, &req, resps); err != nil {
		t.Fatalf("Do(%v): %v", req.Op, err)
	}
	return resps[0]
}

func get(t *testing.T, s *Store, key string) protocol.Response {
	t.Helper()
	return do(t, s, protocol.Request{Op: protocol.OpGets, Keys: [][]byte{[]byte(key)}})
}

func set(t *testing.T, s *Store, key, value string, flags uint32, exptime int64) protocol.Response {
	t.Helper()
	r := do(t, s, protocol.Request{Op: protocol.OpSet, Key: []byte(key), Value: []byte(value), Flags: flags, Exptime: exptime})
	if r.Status != protocol.StatusOK {
		t.Fatalf("set %q: status %v", key, r.Status)
	}
	return r
}

// wantHit fails unless key holds value.
func wantHit(t *testing.T, s *Store, key, value string) protocol.Response {
	t.Helper()
	r := get(t, s, key)
	if r.Status != protocol.StatusOK || string(r.Value) != value {
		t.Fatalf("get %q = status %v value %q, want hit %q", key, r.Status, r.Value, value)
	}
	return r
}

func wantMiss(t *testing.T, s *Store, key string) {
	t.Helper()
	if r := get(t, s, key); r.Status != protocol.StatusNotFound {
		t.Fatalf("get %q = status %v value %q, want miss", key, r.Status, r.Value)
	}
}

// stat returns the named stat's value.
func stat(t *testing.T, s *Store, name string) string {
	t.Helper()
	for _, st := range s.Stats() {
		if st.Name == name {
			return st.Value
		}
	}
	t.Fatalf("no stat %q", name)
	return ""
}
