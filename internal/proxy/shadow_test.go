package proxy_test

import (
	"context"
	"fmt"
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

// shadowing is a proxy whose default pool "main" shadows fraction of its keys to a pool of
// one server, shadow.
func shadowing(t *testing.T, shadow pool.Server, fraction float64) (*proxy.Proxy, *prometheus.Registry, *pool.Pool) {
	t.Helper()
	main := newPool(t, "main", 2)
	sp, err := pool.New("sandbox", pool.Options{}, []pool.Member{{Name: "s", Addr: "s:1", Weight: 1, Server: shadow}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	features := route.NewShared(route.Options{Registry: reg})
	topology.Compose(main, features, topology.Stack{Features: route.Features{Shadow: sp, ShadowFraction: fraction}})
	p := proxy.New(&topology.Topology{Pools: []*pool.Pool{main, sp}, Default: main}, proxy.Options{Registry: reg, Features: features})
	return p, reg, sp
}

func TestShadowCopiesRequests(t *testing.T) {
	defer goleak.VerifyNone(t)
	shadow := newPool(t, "x", 1).Member(0).Server
	p, reg, sp := shadowing(t, shadow, 1)
	main := p.Topology().Default
	gets := map[int]bool{} // main's servers that the get reaches: each copies its share
	for _, k := range []string{"a", "b", "c"} {
		gets[main.Locate([]byte(k))] = true
	}
	set(t, p, "a", "1")
	set(t, p, "b", "2")
	if r := get(p, "a", "b", "c"); string(r[0].Value) != "1" || string(r[1].Value) != "2" || r[2].Status != protocol.StatusNotFound {
		t.Fatalf("get = %+v", r)
	}
	handle(p, &protocol.Request{Op: protocol.OpDelete, Key: []byte("b")})
	if err := p.Close(context.Background()); err != nil { // sends what is queued
		t.Fatal(err)
	}
	if !holds(t, sp.Member(0), "a") || holds(t, sp.Member(0), "b") {
		t.Error("the shadow pool did not see set a, set b, delete b")
	}
	if got, want := value(t, reg, "moxi_shadow_requests_total", "pool", "main", "result", "ok"), float64(3+len(gets)); got != want {
		t.Errorf("shadow ok = %v, want %v (2 sets, the get's %d shares, 1 delete)", got, want, len(gets))
	}
}

func TestShadowFailuresNeverReachClients(t *testing.T) {
	defer goleak.VerifyNone(t)
	p, reg, _ := shadowing(t, failing{}, 1)
	for i := range 20 {
		k := fmt.Sprint("k", i)
		set(t, p, k, "v")
		if r := get(p, k); string(r[0].Value) != "v" {
			t.Fatalf("get %s = %+v", k, r[0])
		}
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := value(t, reg, "moxi_shadow_requests_total", "pool", "main", "result", "error"); got != 40 {
		t.Errorf("shadow errors = %v, want 40", got)
	}
}

// stuck is a server that answers nothing until its request's context ends.
type stuck struct{ failing }

func (s stuck) do(ctx context.Context, order *turn.Turn, _ *protocol.Request, _ []protocol.Response) error {
	<-ctx.Done()
	return ctx.Err()
}

func (s stuck) Start(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error, done func()) {
	pool.StartWaiting(ctx, order, reqs, resps, errs, done, s.do)
}

func TestShadowQueueBounded(t *testing.T) {
	defer goleak.VerifyNone(t)
	p, reg, _ := shadowing(t, stuck{}, 1)
	const n = 5000
	start := time.Now()
	for i := range n {
		set(t, p, fmt.Sprint("k", i), "v")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("%d sets took %v with a stuck shadow pool", n, d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_ = p.Close(ctx) // gives up on the stuck shadow requests; its workers exit
	dropped := value(t, reg, "moxi_shadow_requests_total", "pool", "main", "result", "dropped")
	if dropped < n-1024 {
		t.Errorf("dropped = %v of %d, want all but the 1024 queued or being sent", dropped, n)
	}
}

func TestShadowFractionZeroOrUnchosen(t *testing.T) {
	defer goleak.VerifyNone(t)
	shadow := newPool(t, "x", 1).Member(0).Server
	p, _, sp := shadowing(t, shadow, 0.1)
	var chosen int
	for i := range 1000 {
		set(t, p, fmt.Sprint("k", i), "v")
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		if holds(t, sp.Member(0), fmt.Sprint("k", i)) {
			chosen++
		}
	}
	if chosen < 70 || chosen > 130 {
		t.Errorf("the shadow pool holds %d of 1000 keys at fraction 0.1", chosen)
	}
}
