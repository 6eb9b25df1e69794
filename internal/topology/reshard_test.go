package topology

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
	"github.com/moxi-proxy/moxi/internal/migrate"
)

// TestReshardLifecycle: a change of a pool's servers is a reshard, reshard-1, whose pairs
// are the moves of its keys (adding a fourth server to three: one from each to it); a
// build that is aborted does not use its number up; a reload with the same servers keeps
// it until its copies are done, and drops it then; /migrations shows it as one entry.
func TestReshardLifecycle(t *testing.T) {
	mcs := []*memcachedtest.Server{memcachedtest.Start(t), memcachedtest.Start(t), memcachedtest.Start(t), memcachedtest.Start(t)}
	conf := func(n int, extra string) string {
		var b strings.Builder
		b.WriteString("pools:\n  main:\n    failover: false\n" + extra + "    servers:\n")
		for i := range n {
			fmt.Fprintf(&b, "      - {name: s%d, addr: %q}\n", i, mcs[i].Addr)
		}
		return b.String()
	}
	b := &Builder{Dial: true}
	defer b.Close(context.Background())
	build := func(src string) *Pending {
		t.Helper()
		pd, err := b.Build(parse(t, src))
		if err != nil {
			t.Fatal(err)
		}
		return pd
	}
	build(conf(3, "")).Commit(0)
	if len(b.Migrations()) != 0 {
		t.Fatalf("a first build reshards: %+v", b.Migrations())
	}

	aborted := build(conf(4, ""))
	if run := aborted.placements["main"].reshard; run == nil || run.name != "reshard-1" {
		t.Fatalf("a fourth server: reshard %+v, want reshard-1", run)
	}
	aborted.Abort()
	pd := build(conf(4, ""))
	if run := pd.placements["main"].reshard; run == nil || run.name != "reshard-1" {
		t.Fatalf("after an aborted build: reshard %+v, want reshard-1 again", run)
	}
	if len(pd.migrations) != 3 {
		t.Errorf("%d pairs, want 3: one from each server to the new one", len(pd.migrations))
	}
	for k := range pd.migrations {
		if k.name != "reshard-1" || k.to != mcs[3].Addr {
			t.Errorf("pair %+v, want reshard-1 to %s", k, mcs[3].Addr)
		}
	}
	moved := 0
	for _, m := range pd.Topology.Members() {
		if _, ok := m.Server.(*reshardServer); ok { // failover off: no stand-in wraps it
			moved++
			if m.Addr != mcs[3].Addr {
				t.Errorf("%s is a reshard server: keys move to the new server only", m.Addr)
			}
		}
	}
	if moved != 1 {
		t.Errorf("%d reshard servers, want 1", moved)
	}
	pd.Commit(0)

	// The same servers (another setting changed): the reshard goes on until done.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(20 * time.Second); !b.reshardDone("main", "reshard-1"); <-tick.C {
		if time.Now().After(deadline) {
			t.Fatalf("reshard-1 not done: %+v", b.Migrations())
		}
	}
	if ms := b.Migrations(); len(ms) != 1 || ms[0].Name != "reshard-1" || ms[0].Phase != migrate.Done || strings.Count(ms[0].From, ",") != 2 {
		t.Errorf("/migrations: %+v, want one done entry reshard-1 from the three servers", ms)
	}
	again := build(conf(4, "    retries: 2\n"))
	if run := again.placements["main"].reshard; run != nil {
		t.Errorf("a reload after reshard-1 was done keeps it: %+v", run)
	}
	again.Commit(0)
	if ms := b.Migrations(); len(ms) != 0 {
		t.Errorf("/migrations after the done reshard was dropped: %+v", ms)
	}
	// The next change is reshard-2.
	next := build(conf(3, ""))
	if run := next.placements["main"].reshard; run == nil || run.name != "reshard-2" {
		t.Errorf("removing a server: reshard %+v, want reshard-2", run)
	}
	next.Abort()
}
