package replica_test

import (
	"testing"

	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/replica"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// replicated is a pool of n replicas over members, its servers composed into replicas, as
// package topology composes them; opts.StandIns is its Debts.
func replicated(t testing.TB, n int, opts replica.Options, members ...pool.Member) *pool.Pool {
	t.Helper()
	pl, err := pool.New("p", pool.Options{Replicas: n, Debts: opts.StandIns}, members)
	if err != nil {
		t.Fatal(err)
	}
	servers := make([]pool.Server, pl.Len())
	for i := range servers {
		servers[i] = pl.Member(i).Server
	}
	for i, s := range replica.Wrap(pl, opts, servers) {
		pl.Member(i).Server = s
	}
	return pl
}
