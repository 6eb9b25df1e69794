package topology

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func parse(t *testing.T, src string) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte(src), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestReloadReusesUnchangedServers: a server whose settings a reload leaves alone is the
// same object (connections, health and embedded data kept); one whose settings change is
// new, and the old one is closed after the grace period.
func TestReloadReusesUnchangedServers(t *testing.T) {
	mc := memcachedtest.Start(t)
	b := &Builder{Dial: true}
	defer b.Close(context.Background())
	first := parse(t, "pools:\n  main:\n    servers: ["+mc.Addr+"]\n  local:\n    embedded: 2\ndefault_pool: main\n")
	p1, err := b.Build(first)
	if err != nil {
		t.Fatal(err)
	}
	p1.Commit(10 * time.Millisecond)
	same := parse(t, "pools:\n  main:\n    retries: 3\n    servers: ["+mc.Addr+"]\n  local:\n    embedded: 2\ndefault_pool: main\nroutes:\n  - {prefix: \"l:\", pool: local}\n")
	p2, err := b.Build(same)
	if err != nil {
		t.Fatal(err)
	}
	p2.Commit(10 * time.Millisecond)
	for i, pl := range p1.Topology.Pools {
		for j := range pl.Len() {
			if p2.Topology.Pools[i].Member(j).Base != pl.Member(j).Base {
				t.Errorf("pool %s member %d: a reload that left it alone made a new server", pl.Name(), j)
			}
		}
	}
	changed := parse(t, "pools:\n  main:\n    timeout: 1s\n    servers: ["+mc.Addr+"]\n  local:\n    embedded: 2\ndefault_pool: main\n")
	p3, err := b.Build(changed)
	if err != nil {
		t.Fatal(err)
	}
	p3.Commit(10 * time.Millisecond)
	if p3.Topology.Default.Member(0).Base == p1.Topology.Default.Member(0).Base {
		t.Error("a new timeout reused the server built with the old one")
	}
	if p3.Topology.Pools[1].Member(0).Base != p1.Topology.Pools[1].Member(0).Base {
		t.Error("an embedded shard was rebuilt (and lost its data) by an unrelated change")
	}
}

// TestFailedBuildChangesNothing: a config that cannot be built closes what it created.
func TestFailedBuildChangesNothing(t *testing.T) {
	b := &Builder{Dial: true}
	defer b.Close(context.Background())
	cfg := parse(t, "pools:\n  main:\n    servers: [127.0.0.1:1]\n")
	cfg.DefaultPool = "missing" // what validation would refuse; Build must too
	if _, err := b.Build(cfg); err == nil {
		t.Fatal("a topology with a missing default pool was built")
	}
}

// TestComposedServersKeepTheirBase: a pool with a backup, warm_from or shadow pool sends
// its requests through servers composed around its own (package route), made anew by each
// build; its members' Base is the server itself, the same across reloads, which is what
// failover's stand-ins remember keys by.
func TestComposedServersKeepTheirBase(t *testing.T) {
	b := &Builder{Dial: true}
	defer b.Close(context.Background())
	src := "pools:\n  main:\n    backup: spare\n    warm_from: old\n    shadow: {pool: old, fraction: 0.5}\n    embedded: 2\n" +
		"  spare:\n    embedded: 1\n  old:\n    embedded: 1\ndefault_pool: main\n"
	var builds []*Pending
	for range 2 {
		pd, err := b.Build(parse(t, src))
		if err != nil {
			t.Fatal(err)
		}
		pd.Commit(10 * time.Millisecond)
		builds = append(builds, pd)
	}
	for j := range 2 {
		first, second := builds[0].Topology.Default.Member(j), builds[1].Topology.Default.Member(j)
		if first.Server == first.Base {
			t.Errorf("member %d: nothing composed around its server", j)
		}
		if first.Base != second.Base {
			t.Errorf("member %d: a reload that left it alone changed its base server", j)
		}
	}
	if spare := builds[0].Topology.Pools[1].Member(0); spare.Server != spare.Base {
		t.Error("a pool without features has a server composed around its own")
	}
}
