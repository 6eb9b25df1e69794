package pool

import (
	"context"
	"testing"

	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// upServer is a server that is up and answers nothing; name keeps two of them apart (two
// pointers to a zero-size value may be equal).
type upServer struct{ name string }

func (upServer) Do(context.Context, *turn.Turn, *protocol.Request, []protocol.Response) error {
	return nil
}
func (upServer) DoBatch(context.Context, *turn.Turn, []protocol.Request, []protocol.Response, []error) {
}
func (upServer) Up() bool     { return true }
func (upServer) Info() Info   { return Info{State: StateUp} }
func (upServer) Close() error { return nil }
func (upServer) Stats() []protocol.Stat {
	return []protocol.Stat{{Name: "state", Value: string(StateUp)}, {Name: "requests", Value: "0"}}
}

// TestReplicaAwayState: a replica that is up but owes keys shows "away" in /servers and
// stats proxy, and serves no key until it has deleted them.
func TestReplicaAwayState(t *testing.T) {
	standIns := NewStandIns(10, nil)
	a, b := &upServer{"a"}, &upServer{"b"}
	p, err := New("p", Options{Replicas: 2, StandIns: standIns}, []Member{
		{Name: "a", Addr: "a:1", Weight: 1, Server: a}, {Name: "b", Addr: "b:1", Weight: 1, Server: b},
	})
	if err != nil {
		t.Fatal(err)
	}
	standIns.away(a, []byte("k"))
	m := p.Member(0)
	if got := m.Server.Info().State; got != StateAway {
		t.Errorf("state %q, want away", got)
	}
	if got := m.Server.Stats()[0]; got.Value != string(StateAway) {
		t.Errorf("stats %v, want state away", got)
	}
	if got := p.Member(1).Server.Info().State; got != StateUp {
		t.Errorf("the other replica's state %q, want up", got)
	}
}
