package pool_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/moxi-proxy/moxi/internal/pool"
)

// zonedPool is a pool of zones a (servers a1 a2 a3) and b (b1 b2), members named
// "<zone>/<server>".
func zonedPool(t *testing.T, distribution string, zones map[string][]string, order ...string) *pool.Pool {
	t.Helper()
	var members []pool.Member
	for _, z := range order {
		for _, s := range zones[z] {
			members = append(members, pool.Member{Name: z + "/" + s, Addr: s, Weight: 1, Zone: z})
		}
	}
	p, err := pool.New("p", pool.Options{Distribution: distribution, Zones: order}, members)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestZonesPlaceAsTheirServersAlone: each zone places a key on the server a pool of that
// zone's servers alone places it on (so each zone's ring is twemproxy's), the zones in
// listed order, with every distribution.
func TestZonesPlaceAsTheirServersAlone(t *testing.T) {
	zones := map[string][]string{"a": {"a1:1", "a2:1", "a3:1"}, "b": {"b1:1", "b2:1"}}
	for _, d := range pool.Distributions() {
		p := zonedPool(t, d, zones, "b", "a")
		alone := map[string]*pool.Pool{"a": replicatedPool(t, d, 1, zones["a"]...), "b": replicatedPool(t, d, 1, zones["b"]...)}
		if p.Replicas() != 2 || !slices.Equal(p.Zones(), []string{"b", "a"}) {
			t.Fatalf("%s: %d replicas, zones %v", d, p.Replicas(), p.Zones())
		}
		for i := range 2000 {
			k := []byte(fmt.Sprintf("key:%d", i))
			set := p.ReplicaSetOf(k)
			var want []string
			for _, z := range []string{"b", "a"} {
				want = append(want, z+"/"+alone[z].Member(alone[z].Owner(k)).Name)
			}
			if got := names(p, set.Idx[:set.N]); !slices.Equal(got, want) {
				t.Fatalf("%s: %s is on %v, want %v", d, k, got, want)
			}
			if z := p.ZoneOf(set.Idx[1]); z != 1 {
				t.Fatalf("%s: the second member of %s is in zone %d", d, k, z)
			}
		}
	}
}

// TestZonesMoveWithinAZone: a change of one zone's servers moves keys between that zone's
// servers only.
func TestZonesMoveWithinAZone(t *testing.T) {
	before := zonedPool(t, "ketama", map[string][]string{"a": {"a1:1", "a2:1"}, "b": {"b1:1", "b2:1"}}, "a", "b")
	after := zonedPool(t, "ketama", map[string][]string{"a": {"a1:1", "a2:1"}, "b": {"b1:1", "b2:1", "b3:1"}}, "a", "b")
	moves := after.MovedFrom(before)
	if len(moves) == 0 {
		t.Fatal("adding a server to zone b moves nothing")
	}
	for _, m := range moves {
		if m.To != "b3:1" || (m.From != "b1:1" && m.From != "b2:1") {
			t.Errorf("move %+v: want only from zone b's servers to b3", m)
		}
	}
}
