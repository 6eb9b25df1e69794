package pool_test

import (
	"testing"

	"github.com/moxi-proxy/moxi/internal/pool"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newStandIns is a StandIns closed with the test.
func newStandIns(t testing.TB, max int) *pool.StandIns {
	l := pool.NewStandIns(max, nil)
	t.Cleanup(l.Close)
	return l
}
