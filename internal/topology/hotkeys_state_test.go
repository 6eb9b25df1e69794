package topology

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/moxi-proxy/moxi/internal/hotkeys"
	"github.com/moxi-proxy/moxi/internal/pool"
)

// build commits cfg's topology on a Builder of its own, closed when t ends.
func build(t *testing.T, src string) *Topology {
	t.Helper()
	b := &Builder{}
	t.Cleanup(func() { _ = b.Close(context.Background()) })
	pd, err := b.Build(parse(t, src))
	if err != nil {
		t.Fatal(err)
	}
	pd.Commit(0)
	return pd.Topology
}

// poolNamed is t's pool named name, or nil.
func poolNamed(t *Topology, name string) *pool.Pool {
	for _, pl := range t.Pools {
		if pl.Name() == name {
			return pl
		}
	}
	return nil
}

// TestHotKeysHandedOver: the keys hot in a pool before an upgrade are absorbed by the hot
// cache of the successor's pool of the same name from its first request; a pool of another
// name starts empty, and with hot_keys off nothing is exported or seeded.
func TestHotKeysHandedOver(t *testing.T) {
	const pools = "pools:\n  main:\n    servers: [127.0.0.1:1]\n  %s:\n    servers: [127.0.0.1:2]\ndefault_pool: main\n"
	const on = "hot_keys: {sample: 1, cache: true}\n"
	old := build(t, fmt.Sprintf(pools, "gone")+on)
	for _, name := range []string{"main", "gone"} {
		s := old.HotKeys[poolNamed(old, name)]
		for range 200 {
			s.Observe([]byte("hot:"+name), 100)
		}
	}
	data, err := json.Marshal(old.ExportHotKeys())
	if err != nil {
		t.Fatal(err)
	}
	var states map[string]hotkeys.SketchState
	if err := json.Unmarshal(data, &states); err != nil {
		t.Fatal(err)
	}
	if len(states) != 2 {
		t.Fatalf("exported the sketches of %d pools, want 2", len(states))
	}

	next := build(t, fmt.Sprintf(pools, "fresh")+on)
	next.ImportHotKeys(states)
	mainPool, fresh := poolNamed(next, "main"), poolNamed(next, "fresh")
	if !next.HotKey(mainPool, []byte("hot:main")) {
		t.Error("a key hot in main before the upgrade is not absorbed after it")
	}
	if next.HotKey(fresh, []byte("hot:gone")) || next.HotKey(mainPool, []byte("hot:gone")) {
		t.Error("a key hot in a pool the successor does not have is hot in another")
	}

	off := build(t, fmt.Sprintf(pools, "fresh"))
	if got := off.ExportHotKeys(); got != nil {
		t.Errorf("hot_keys off exports %v", got)
	}
	off.ImportHotKeys(states)
	if off.HotKey(poolNamed(off, "main"), []byte("hot:main")) {
		t.Error("hot_keys off, a key is hot after an import")
	}
}
