package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/proxy"
	"github.com/moxi-proxy/moxi/internal/route"
	"github.com/moxi-proxy/moxi/internal/topology"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// slowCopies is a server that takes writes only once gate is closed, and answers reads at
// once: a backup pool whose copies are late.
type slowCopies struct {
	pool.Server
	gate chan struct{}
}

func (s slowCopies) do(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response) error {
	if !req.Op.IsRetrieval() {
		select {
		case <-s.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return pool.Do(ctx, s.Server, order, req, resps)
}

func (s slowCopies) Start(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error, done func()) {
	pool.StartWaiting(ctx, order, reqs, resps, errs, done, s.do)
}

// backedUp is a proxy whose default pool "main" (one embedded shard) has the backup pool
// "spare", whose one server takes writes once gate is closed; spare's store holds k=old.
// store is main's server itself, under its composed one.
func backedUp(t *testing.T, gate chan struct{}, budget int) (p *proxy.Proxy, reg *prometheus.Registry, store pool.Server) {
	t.Helper()
	main := newPool(t, "main", 1)
	store = main.Member(0).Server
	spareStore := newPool(t, "spare-store", 1).Member(0).Server
	spare, err := pool.New("spare", pool.Options{}, []pool.Member{{Name: "s", Addr: "s:1", Weight: 1, Server: slowCopies{spareStore, gate}}})
	if err != nil {
		t.Fatal(err)
	}
	old := &protocol.Request{Op: protocol.OpSet, Key: []byte("k"), Value: []byte("old")}
	if err := pool.Do(context.Background(), spareStore, nil, old, make([]protocol.Response, 1)); err != nil {
		t.Fatal(err)
	}
	reg = prometheus.NewRegistry()
	features := route.NewShared(route.Options{Registry: reg, MaxBackgroundBytes: budget})
	topology.Compose(main, features, topology.Stack{Features: route.Features{Backup: spare}})
	p = proxy.New(&topology.Topology{Pools: []*pool.Pool{main, spare}, Default: main}, proxy.Options{Registry: reg, Features: features})
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	if r := get(p, "k"); string(r[0].Value) != "old" {
		t.Fatalf("get k before any write: %+v; want the backup's value", r[0])
	}
	return p, reg, store
}

// evict deletes key on store, as memcached's LRU would.
func evict(t *testing.T, store pool.Server, key string) {
	t.Helper()
	del := &protocol.Request{Op: protocol.OpDelete, Key: []byte(key)}
	if err := pool.Do(context.Background(), store, nil, del, make([]protocol.Response, 1)); err != nil {
		t.Fatal(err)
	}
}

// TestBackupNeverAnswersOlder: the copies to a backup pool are late, so a read that misses
// on the pool must not answer the backup's value while a later write's copy is on its way
// (it answers a miss); once the copy has landed, the backup answers the key again.
func TestBackupNeverAnswersOlder(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after the proxy's Close, a cleanup of backedUp's
	gate := make(chan struct{})
	p, reg, store := backedUp(t, gate, 0)
	if r := handle(p, &protocol.Request{Op: protocol.OpDelete, Key: []byte("k")}); r[0].Status != protocol.StatusNotFound {
		t.Fatalf("delete k: %+v", r[0])
	}
	if r := get(p, "k"); r[0].Status != protocol.StatusNotFound {
		t.Fatalf("get k after its delete, the copy on its way: %+v; want a miss", r[0])
	}
	set(t, p, "k", "new")
	evict(t, store, "k")
	if r := get(p, "k"); r[0].Status != protocol.StatusNotFound {
		t.Fatalf("get k after a set whose copy is on its way, evicted here: %+v; want a miss", r[0])
	}
	close(gate)
	eventually(t, "both copies landed", func() bool { return value(t, reg, "moxi_backup_writes_total") == 2 })
	if r := get(p, "k"); string(r[0].Value) != "new" {
		t.Fatalf("get k once the copies landed: %+v; want the backup's new value", r[0])
	}
}

// TestBackupLostCopy: a key whose copy to the backup was dropped is never read from there
// again: the backup may hold its value from before the write.
func TestBackupLostCopy(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after the proxy's Close, a cleanup of backedUp's
	gate := make(chan struct{})
	p, reg, store := backedUp(t, gate, 1) // every copy weighs more than the budget: dropped
	set(t, p, "k", "new")
	if got := value(t, reg, "moxi_backup_writes_dropped_total"); got != 1 {
		t.Fatalf("%v copies dropped, want 1", got)
	}
	evict(t, store, "k")
	if r := get(p, "k"); r[0].Status != protocol.StatusNotFound {
		t.Fatalf("get k after its copy was dropped, evicted here: %+v; want a miss, not the backup's old value", r[0])
	}
	close(gate)
}

// eventually polls cond until it holds, or fails the test after a generous deadline.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("%s: not within 20s", what)
		}
	}
}

// TestBackupCopiesMetaWrites: meta writes are copied to the backup pool as every write is
// (else it would keep a value older than an ms acknowledged here); a meta cas is copied,
// without its C, once it succeeded, and not at all when it failed.
func TestBackupCopiesMetaWrites(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	gate := make(chan struct{})
	close(gate) // copies land at once
	p, reg, store := backedUp(t, gate, 0)
	meta := func(wire string) protocol.Response {
		t.Helper()
		var req protocol.Request
		r := protocol.NewTextReader(bufio.NewReader(strings.NewReader(wire)), protocol.DefaultLimits())
		if err := r.Read(&req); err != nil {
			t.Fatalf("%q: %v", wire, err)
		}
		return handle(p, &req)[0]
	}
	landed := func(n float64) {
		t.Helper()
		eventually(t, fmt.Sprint(n, " copies landed"), func() bool { return value(t, reg, "moxi_backup_writes_total") == n })
	}
	meta("ms k 3 T0\r\nnew\r\n") // k was "old" on the backup only
	landed(1)
	gets := meta("mg k c v\r\n")
	if gets.Meta.Code != protocol.MetaVA || string(gets.Value) != "new" {
		t.Fatalf("mg k c v = %+v", gets)
	}
	var cas string
	for _, f := range strings.Fields(string(gets.Meta.Flags)) {
		if strings.HasPrefix(f, "c") {
			cas = f[1:]
		}
	}
	if r := meta("ms k 4 C999999 T0\r\nlost\r\n"); r.Meta.Code != protocol.MetaEX {
		t.Fatalf("ms with a wrong cas = %+v", r)
	}
	if r := meta("ms k 4 C" + cas + " T0\r\nwon!\r\n"); r.Meta.Code != protocol.MetaHD {
		t.Fatalf("ms with its cas = %+v", r)
	}
	landed(2) // the failed cas was not copied; the one that succeeded was
	evict(t, store, "k")
	if r := get(p, "k"); string(r[0].Value) != "won!" {
		t.Fatalf("get k, evicted here, from the backup: %+v; want the cas's value", r[0])
	}
	meta("md k\r\n")
	landed(3)
	if r := get(p, "k"); r[0].Status != protocol.StatusNotFound {
		t.Fatalf("get k after md: %+v; want a miss here and on the backup", r[0])
	}
	if dropped := value(t, reg, "moxi_backup_writes_dropped_total"); dropped > 0 {
		t.Fatalf("%v copies dropped", dropped)
	}
}
