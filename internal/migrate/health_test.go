package migrate

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
	"github.com/moxi-proxy/moxi/internal/memstore"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// switchable is a server whose health the test sets; it counts its requests.
type switchable struct {
	*memstore.Store
	up atomic.Bool
}

func (s *switchable) Up() bool { return s.up.Load() }

func (s *switchable) Info() pool.Info {
	info := s.Store.Info()
	if !s.Up() {
		info.State = pool.StateDead
	}
	info.Counters.Connections, info.Counters.ConnectionsUp = 4, 3
	return info
}

// TestMigrationForwardsHealthAndCounters: a migrating slot is its new server to failover
// and to the admin views — its health, its counters and its stats proxy lines — with the
// state "migrating" while the copy runs.
func TestMigrationForwardsHealthAndCounters(t *testing.T) {
	newServer := &switchable{Store: memstore.New(memstore.Options{})}
	newServer.up.Store(true)
	m := New(Options{Pool: "p", Name: "s", From: memcachedtest.Blackhole(t), To: "new", New: newServer})
	defer m.Close()

	req := protocol.Request{Op: protocol.OpSet, Key: []byte("k"), Value: []byte("v")}
	var resp [1]protocol.Response
	if err := pool.Do(context.Background(), m, nil, &req, resp[:]); err != nil {
		t.Fatal(err)
	}
	info := m.Info()
	if info.State != pool.StateMigrating {
		t.Errorf("state %q while copying, want %q", info.State, pool.StateMigrating)
	}
	if info.Counters != newServer.Info().Counters || info.Counters.Requests == 0 || info.Counters.ConnectionsUp != 3 {
		t.Errorf("counters %+v, want the new server's %+v", info.Counters, newServer.Info().Counters)
	}
	if got, want := fmt.Sprint(m.Stats()), fmt.Sprint(newServer.Stats()); got != want {
		t.Errorf("stats proxy lines %s, want the new server's %s", got, want)
	}

	newServer.up.Store(false)
	if m.Up() {
		t.Error("migration up while its new server is dead")
	}
	if st := m.Info().State; st != pool.StateDead {
		t.Errorf("state %q with the new server dead, want %q", st, pool.StateDead)
	}
}

// TestFailoverSeesDeadMigratingSlot: with failover on, the keys of a migrating slot whose
// new server is dead go to another server, as any dead server's keys do.
func TestFailoverSeesDeadMigratingSlot(t *testing.T) {
	newServer := &switchable{Store: memstore.New(memstore.Options{})}
	newServer.up.Store(true)
	m := New(Options{Pool: "p", Name: "a", From: memcachedtest.Blackhole(t), To: "new", New: newServer})
	defer m.Close()
	other := memstore.New(memstore.Options{})
	pl, err := pool.New("p", pool.Options{Failover: true}, []pool.Member{
		{Name: "a", Addr: "new", Weight: 1, Server: m},
		{Name: "b", Addr: "b", Weight: 1, Server: other},
	})
	if err != nil {
		t.Fatal(err)
	}
	var slotKeys [][]byte
	for i := 0; len(slotKeys) < 50; i++ {
		if k := []byte(fmt.Sprintf("key%d", i)); pl.Locate(k) == 0 {
			slotKeys = append(slotKeys, k)
		}
	}
	newServer.up.Store(false)
	for _, k := range slotKeys {
		if i := pl.Locate(k); i != 1 {
			t.Fatalf("key %s of the dead migrating slot placed on member %d, want the live one", k, i)
		}
	}
	newServer.up.Store(true)
	for _, k := range slotKeys {
		if i := pl.Locate(k); i != 0 {
			t.Fatalf("key %s placed on member %d after its server recovered, want 0", k, i)
		}
	}
}

// TestScheduledServesOld: before migrate_at the slot is its old server, exactly as before
// the reload: requests, health and phase; nothing reaches the new server.
func TestScheduledServesOld(t *testing.T) {
	oldServer, newServer := memstore.New(memstore.Options{}), memstore.New(memstore.Options{})
	m := New(Options{Pool: "p", Name: "s", From: memcachedtest.Blackhole(t), To: "new", New: newServer, Old: oldServer, At: time.Now().Add(time.Hour)})
	m.Copy()
	defer m.Close()
	if p := m.Phase(); p != Scheduled {
		t.Errorf("phase %q before migrate_at, want %q", p, Scheduled)
	}
	var r [1]protocol.Response
	if err := pool.Do(context.Background(), m, nil, &protocol.Request{Op: protocol.OpSet, Key: []byte("k"), Value: []byte("v")}, r[:]); err != nil {
		t.Fatal(err)
	}
	resps := make([]protocol.Response, 1)
	errs := make([]error, 1)
	pool.DoBatch(context.Background(), m, nil, []protocol.Request{{Op: protocol.OpSet, Key: []byte("b"), Value: []byte("v")}}, resps, errs)
	if o, n := oldServer.Info().Counters.Requests, newServer.Info().Counters.Requests; o != 2 || n != 0 {
		t.Errorf("old server got %d requests, new %d; want 2 and 0", o, n)
	}
}
