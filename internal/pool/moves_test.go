package pool

import (
	"cmp"
	"fmt"
	"slices"
	"testing"
)

// placementPool is a pool of servers at addrs, for placement only.
func placementPool(t *testing.T, dist string, addrs ...string) *Pool {
	return replicatedPlacement(t, dist, 1, addrs...)
}

// replicatedPlacement is placementPool keeping replicas copies of each key.
func replicatedPlacement(t *testing.T, dist string, replicas int, addrs ...string) *Pool {
	t.Helper()
	members := make([]Member, len(addrs))
	for i, a := range addrs {
		members[i] = Member{Name: a, Addr: a, Weight: 1}
	}
	p, err := New("p", Options{Distribution: dist, Replicas: replicas}, members)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestMovedFrom: the moves listed are exactly those 100,000 keys make, for a server added
// to and one removed from a ketama pool (keys move to the new server only, and from the
// removed one only); with jump every pair is listed.
func TestMovedFrom(t *testing.T) {
	keysMoves := func(before, after *Pool) []Move {
		var out []Move
		for i := range 100_000 {
			k := fmt.Appendf(nil, "key:%d", i)
			m := Move{before.Member(before.Owner(k)).Addr, after.Member(after.Owner(k)).Addr}
			if m.From != m.To && !slices.Contains(out, m) {
				out = append(out, m)
			}
		}
		return out
	}
	sorted := func(m []Move) []Move {
		slices.SortFunc(m, func(a, b Move) int { return cmp.Or(cmp.Compare(a.From, b.From), cmp.Compare(a.To, b.To)) })
		return m
	}
	abc := placementPool(t, "ketama", "a:1", "b:1", "c:1")
	abcd := placementPool(t, "ketama", "a:1", "b:1", "c:1", "d:1")
	ab := placementPool(t, "ketama", "a:1", "b:1")
	for _, tc := range []struct {
		name          string
		before, after *Pool
		want          []Move
	}{
		{"added", abc, abcd, []Move{{"a:1", "d:1"}, {"b:1", "d:1"}, {"c:1", "d:1"}}},
		{"removed", abc, ab, []Move{{"c:1", "a:1"}, {"c:1", "b:1"}}},
		{"unchanged", abc, abc, nil},
	} {
		got := sorted(tc.after.MovedFrom(tc.before))
		if !slices.Equal(got, sorted(tc.want)) {
			t.Errorf("%s: moves %v, want %v", tc.name, got, tc.want)
		}
		if keys := sorted(keysMoves(tc.before, tc.after)); !slices.Equal(got, keys) {
			t.Errorf("%s: moves %v, the keys' %v", tc.name, got, keys)
		}
	}
	if got := placementPool(t, "jump", "a:1", "b:1", "c:1").MovedFrom(placementPool(t, "jump", "a:1", "b:1")); len(got) != 4 {
		t.Errorf("jump: moves %v, want every pair of different addresses (4)", got)
	}
}

// TestPairedFromReplicas: with replicas, every server that stops holding a key hands it to
// exactly one that holds it now, a server that starts holding it takes it from at most one,
// the moves listed are exactly the pairs 20,000 keys make (ketama), and a server that keeps
// holding a key takes nothing over from a server that stops, unless the pool keeps fewer
// replicas than before.
func TestPairedFromReplicas(t *testing.T) {
	replicated := func(n int, addrs ...string) *Pool { return replicatedPlacement(t, "ketama", n, addrs...) }
	names := func(p *Pool, k []byte) []string {
		var out []string
		for _, i := range p.ReplicasOf(k) {
			out = append(out, p.Member(i).Addr)
		}
		return out
	}
	for _, tc := range []struct {
		name          string
		before, after *Pool
	}{
		{"added", replicated(2, "a:1", "b:1", "c:1"), replicated(2, "a:1", "b:1", "c:1", "d:1")},
		{"removed", replicated(2, "a:1", "b:1", "c:1", "d:1"), replicated(2, "a:1", "b:1", "c:1")},
		{"three of five, one replaced", replicated(3, "a:1", "b:1", "c:1", "d:1", "e:1"), replicated(3, "a:1", "b:1", "c:1", "d:1", "f:1")},
		{"fewer replicas", replicated(3, "a:1", "b:1", "c:1"), replicated(2, "a:1", "b:1", "c:1")},
	} {
		var pairs []Move
		for i := range 20_000 {
			k := fmt.Appendf(nil, "key:%d", i)
			was, is := names(tc.before, k), names(tc.after, k)
			takers := map[string]int{}
			for _, to := range is {
				from, ok := tc.after.PairedFrom(tc.before, k, to)
				if !ok {
					continue
				}
				if slices.Contains(is, from) || !slices.Contains(was, from) {
					t.Fatalf("%s: %s (%v → %v): %s takes over from %s", tc.name, k, was, is, to, from)
				}
				if slices.Contains(was, to) && len(is) >= len(was) {
					t.Fatalf("%s: %s (%v → %v): %s held it and takes over from %s", tc.name, k, was, is, to, from)
				}
				takers[from]++
				if m := (Move{from, to}); !slices.Contains(pairs, m) {
					pairs = append(pairs, m)
				}
			}
			for _, from := range was {
				if !slices.Contains(is, from) && takers[from] != 1 {
					t.Fatalf("%s: %s (%v → %v): %s hands it to %d servers", tc.name, k, was, is, from, takers[from])
				}
			}
		}
		moves := tc.after.MovedFrom(tc.before)
		for _, m := range pairs {
			if !slices.Contains(moves, m) {
				t.Errorf("%s: keys move %v, not listed in %v", tc.name, m, moves)
			}
		}
		if len(pairs) == 0 {
			t.Errorf("%s: no key moves", tc.name)
		}
	}
}
