package migrate

import (
	"context"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
	"github.com/moxi-proxy/moxi/internal/memstore"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// TestDeadOldServerDoesNotStallReads: when the old server stops answering, the first read
// that misses waits for it once; the next ones answer their miss at once.
func TestDeadOldServerDoesNotStallReads(t *testing.T) {
	// A read that asks the old server takes its whole timeout here, so a second read
	// quicker than the timeout did not ask; the timeout is long enough that a loaded
	// machine cannot blur the two.
	const timeout = time.Second
	m := New(Options{Pool: "p", Name: "s", From: memcachedtest.Blackhole(t), To: "new", New: memstore.New(memstore.Options{}), Timeout: timeout})
	defer m.Close()
	get := func() (protocol.Response, time.Duration) {
		req := protocol.Request{Op: protocol.OpGet, Keys: [][]byte{[]byte("k")}}
		resps := make([]protocol.Response, 1)
		start := time.Now()
		if err := pool.Do(context.Background(), m, nil, &req, resps); err != nil {
			t.Fatal(err)
		}
		return resps[0], time.Since(start)
	}
	r, d := get()
	t.Logf("first read: %v", d)
	if r.Status != protocol.StatusNotFound || d < timeout {
		t.Fatalf("first read: status %d after %v; want a miss after the old server's timeout", r.Status, d)
	}
	r, d = get()
	t.Logf("second read: %v", d)
	if r.Status != protocol.StatusNotFound || d >= timeout {
		t.Fatalf("second read: status %d after %v; want a miss at once, not after the old server's timeout %v", r.Status, d, timeout)
	}
}

// TestWriteMarksTouched is the rule that keeps copies from reverting writes:
// after a write through the migration, the key is never read from, or copied from, the
// old server.
func TestWriteMarksTouched(t *testing.T) {
	m := New(Options{Pool: "p", Name: "s", From: memcachedtest.Blackhole(t), To: "new", New: memstore.New(memstore.Options{}), Timeout: 50 * time.Millisecond})
	defer m.Close()
	set := protocol.Request{Op: protocol.OpSet, Key: []byte("k"), Value: []byte("v2")}
	resps := make([]protocol.Response, 1)
	if err := pool.Do(context.Background(), m, nil, &set, resps); err != nil || resps[0].Status != protocol.StatusOK {
		t.Fatalf("set: %v %+v", err, resps[0])
	}
	if !m.isTouched([]byte("k")) {
		t.Fatal("a write did not mark its key touched")
	}
	items, err := m.copyKeys(context.Background(), [][]byte{[]byte("k")}, false)
	if err != nil || items[0].Found {
		t.Fatalf("a copy of a touched key asked the old server: %+v %v", items, err)
	}
}
