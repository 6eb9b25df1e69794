package failover_test

import (
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/failover"
	"github.com/moxi-proxy/moxi/internal/pool"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// failoverPool is a pool with failover over members, its servers composed into stand-ins
// remembered in l, as package topology composes them.
func failoverPool(t testing.TB, l *failover.StandIns, ttl time.Duration, members ...pool.Member) *pool.Pool {
	t.Helper()
	pl, err := pool.New("p", pool.Options{Failover: true, Debts: l}, members)
	if err != nil {
		t.Fatal(err)
	}
	servers := make([]pool.Server, pl.Len())
	for i := range servers {
		servers[i] = pl.Member(i).Server
	}
	for i, s := range failover.Wrap(pl, l, ttl, servers) {
		pl.Member(i).Server = s
	}
	return pl
}
