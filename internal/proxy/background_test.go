package proxy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/proxy"
	"github.com/moxi-proxy/moxi/internal/route"
	"github.com/moxi-proxy/moxi/internal/topology"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// gated is a server that answers every request OK once gate is closed.
type gated struct {
	failing
	gate chan struct{}
}

func (g gated) do(ctx context.Context, order *turn.Turn, _ *protocol.Request, resps []protocol.Response) error {
	select {
	case <-g.gate:
		resps[0] = protocol.Response{}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g gated) Start(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error, done func()) {
	pool.StartWaiting(ctx, order, reqs, resps, errs, done, g.do)
}

// TestBackgroundBudget: backup copies and shadow requests share max_background_bytes; past
// it, while the copies before them are still being sent, they are dropped and counted, and
// the client's write is answered as ever. (That sent copies give their bytes back is the
// queue's to test: bgqueue's TestSharedBytes.)
func TestBackgroundBudget(t *testing.T) {
	defer goleak.VerifyNone(t)
	const (
		sets = 10
		size = 1000 // of each set's value
		fits = 3    // copies of such a set (its value, key and about 256 bytes more) in the budget
	)
	budget := fits * (256 + size + 10)
	tests := []struct {
		name           string
		backup, shadow bool
		// dropped copies: past the budget, a set's backup copy (made first) may still fit
		// when its shadow request does not.
		backupDropped, shadowDropped float64
	}{
		{name: "backup copies", backup: true, backupDropped: sets - fits},
		{name: "shadow requests", shadow: true, shadowDropped: sets - fits},
		{name: "one budget for both", backup: true, shadow: true, backupDropped: sets - 2, shadowDropped: sets - 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gate := make(chan struct{})
			main := newPool(t, "main", 1)
			topo := &topology.Topology{Pools: []*pool.Pool{main}, Default: main}
			slow := func(name string) *pool.Pool {
				pl, err := pool.New(name, pool.Options{}, []pool.Member{{Name: "s", Addr: "s:1", Weight: 1, Server: gated{gate: gate}}})
				if err != nil {
					t.Fatal(err)
				}
				topo.Pools = append(topo.Pools, pl)
				return pl
			}
			var f route.Features
			if tt.backup {
				f.Backup = slow("spare")
			}
			if tt.shadow {
				f.Shadow, f.ShadowFraction = slow("sandbox"), 1
			}
			reg := prometheus.NewRegistry()
			features := route.NewShared(route.Options{Registry: reg, MaxBackgroundBytes: budget})
			topology.Compose(main, features, topology.Stack{Features: f})
			p := proxy.New(topo, proxy.Options{Registry: reg, Features: features})
			count := func(name string, labels ...string) float64 {
				return max(0, value(t, reg, name, labels...)) // a series never touched is absent
			}
			for i := range sets {
				set(t, p, fmt.Sprint("k", i), strings.Repeat("v", size))
			}
			backupDropped := count("moxi_backup_writes_dropped_total")
			shadowDropped := count("moxi_shadow_requests_total", "pool", "main", "result", "dropped")
			if backupDropped != tt.backupDropped || shadowDropped != tt.shadowDropped {
				t.Errorf("dropped %v backup copies and %v shadow requests of %d sets; want %v and %v",
					backupDropped, shadowDropped, sets, tt.backupDropped, tt.shadowDropped)
			}

			close(gate)
			if err := p.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			sent := count("moxi_backup_writes_total") + count("moxi_shadow_requests_total", "pool", "main", "result", "ok")
			if sent != fits {
				t.Errorf("%v copies sent, want the %d that fit", sent, fits)
			}
		})
	}
}
