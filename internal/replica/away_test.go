package replica_test

import (
	"context"
	"testing"

	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/replica"
	"github.com/moxi-proxy/moxi/internal/servertest"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// upServer is a server that is up and answers nothing (every request times out, so a
// cleanup of its keys never ends); name keeps two of them apart (two pointers to a
// zero-size value may be equal).
type upServer struct{ name string }

func (upServer) Start(_ context.Context, order *turn.Turn, _ []protocol.Request, _ []protocol.Response, errs []error, done func()) {
	pool.Fail(order, errs, context.DeadlineExceeded, done)
}
func (upServer) Up() bool        { return true }
func (upServer) Info() pool.Info { return pool.Info{State: pool.StateUp} }
func (upServer) Close() error    { return nil }
func (upServer) Stats() []protocol.Stat {
	return []protocol.Stat{{Name: "state", Value: string(pool.StateUp)}, {Name: "requests", Value: "0"}}
}

// TestReplicaAwayState: a replica that is up but owes keys says so in stats proxy ("away"),
// its state staying up.
func TestReplicaAwayState(t *testing.T) {
	standIns := servertest.StandIns(t, 10)
	a, b := &upServer{"a"}, &upServer{"b"}
	p := replicated(t, 2, replica.Options{StandIns: standIns},
		pool.Member{Name: "a", Addr: "a:1", Weight: 1, Server: a}, pool.Member{Name: "b", Addr: "b:1", Weight: 1, Server: b})
	standIns.Away(a, "p", "a", []byte("k"))
	away := func(m *pool.Member) string {
		stats := m.Server.Stats()
		if last := stats[len(stats)-1]; last.Name == "away" {
			return last.Value
		}
		return "none"
	}
	if got, state := away(p.Member(0)), p.Member(0).Server.Info().State; got != "1" || state != pool.StateUp {
		t.Errorf("the replica that owes: away %s, state %s; want 1, up", got, state)
	}
	if got := away(p.Member(1)); got != "0" {
		t.Errorf("the other replica: away %s, want 0", got)
	}
}
