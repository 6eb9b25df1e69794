package pool

import (
	"context"
	"testing"

	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// upServer is a server that is up and answers nothing (every request times out, so a
// cleanup of its keys never ends); name keeps two of them apart (two pointers to a
// zero-size value may be equal).
type upServer struct{ name string }

func (upServer) Start(_ context.Context, order *turn.Turn, _ []protocol.Request, _ []protocol.Response, errs []error, done func()) {
	Fail(order, errs, context.DeadlineExceeded, done)
}
func (upServer) Up() bool     { return true }
func (upServer) Info() Info   { return Info{State: StateUp} }
func (upServer) Close() error { return nil }
func (upServer) Stats() []protocol.Stat {
	return []protocol.Stat{{Name: "state", Value: string(StateUp)}, {Name: "requests", Value: "0"}}
}

// TestReplicaAwayState: a replica that is up but owes keys says so in stats proxy ("away"),
// its state staying up.
func TestReplicaAwayState(t *testing.T) {
	standIns := NewStandIns(10, nil)
	t.Cleanup(standIns.Close)
	a, b := &upServer{"a"}, &upServer{"b"}
	p, err := New("p", Options{Replicas: 2, StandIns: standIns}, []Member{
		{Name: "a", Addr: "a:1", Weight: 1, Server: a}, {Name: "b", Addr: "b:1", Weight: 1, Server: b},
	})
	if err != nil {
		t.Fatal(err)
	}
	standIns.away(a, "p", "a", []byte("k"))
	away := func(m *Member) string {
		stats := m.Server.Stats()
		if last := stats[len(stats)-1]; last.Name == "away" {
			return last.Value
		}
		return "none"
	}
	if got, state := away(p.Member(0)), p.Member(0).Server.Info().State; got != "1" || state != StateUp {
		t.Errorf("the replica that owes: away %s, state %s; want 1, up", got, state)
	}
	if got := away(p.Member(1)); got != "0" {
		t.Errorf("the other replica: away %s, want 0", got)
	}
}
