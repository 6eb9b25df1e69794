package pool_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/moxi-proxy/moxi/internal/pool"
)

func replicatedPool(t *testing.T, distribution string, replicas int, names ...string) *pool.Pool {
	t.Helper()
	members := make([]pool.Member, len(names))
	for i, n := range names {
		members[i] = pool.Member{Name: n, Addr: n, Weight: 1}
	}
	p, err := pool.New("p", pool.Options{Distribution: distribution, Replicas: replicas}, members)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func names(p *pool.Pool, idx []int) []string {
	out := make([]string, len(idx))
	for i, m := range idx {
		out[i] = p.Member(m).Name
	}
	return out
}

// TestReplicasDistinct: every key has N distinct replicas, the first its owner, with every
// distribution, and they spread over every member.
func TestReplicasDistinct(t *testing.T) {
	for _, d := range pool.Distributions() {
		for _, n := range []int{2, 3, 5} {
			p := replicatedPool(t, d, n, "a:1", "b:1", "c:1", "d:1", "e:1")
			if p.Replicas() != n {
				t.Fatalf("%s: Replicas() = %d, want %d", d, p.Replicas(), n)
			}
			held := make(map[string]int)
			for i := range 10_000 {
				k := []byte(fmt.Sprintf("key:%d", i))
				rs := names(p, p.ReplicasOf(k))
				if len(rs) != n {
					t.Fatalf("%s/%d: %s has replicas %v", d, n, k, rs)
				}
				sorted := slices.Clone(rs)
				slices.Sort(sorted)
				if len(slices.Compact(sorted)) != n {
					t.Fatalf("%s/%d: %s has replicas %v, not distinct", d, n, k, rs)
				}
				if rs[0] != p.Member(p.Owner(k)).Name {
					t.Fatalf("%s/%d: %s's first replica %s is not its owner", d, n, k, rs[0])
				}
				for _, r := range rs {
					held[r]++
				}
			}
			for _, m := range []string{"a:1", "b:1", "c:1", "d:1", "e:1"} {
				if held[m] < 10_000*n/5/2 {
					t.Errorf("%s/%d: %s holds %d of %d copies", d, n, m, held[m], 10_000*n)
				}
			}
		}
	}
}

// TestReplicasStable: adding a server leaves the replicas of every key that does not get a
// copy on it where they were (ketama and jump; modula moves every key, as it does without
// replicas).
func TestReplicasStable(t *testing.T) {
	for _, d := range []string{"ketama", "jump"} {
		before := replicatedPool(t, d, 3, "a:1", "b:1", "c:1", "d:1")
		after := replicatedPool(t, d, 3, "a:1", "b:1", "c:1", "d:1", "e:1")
		moved := 0
		for i := range 10_000 {
			k := []byte(fmt.Sprintf("key:%d", i))
			was, is := names(before, before.ReplicasOf(k)), names(after, after.ReplicasOf(k))
			if slices.Contains(is, "e:1") {
				moved++
				continue
			}
			if !slices.Equal(was, is) {
				t.Fatalf("%s: %s's replicas went from %v to %v, without the new server", d, k, was, is)
			}
		}
		if moved == 0 || moved == 10_000 {
			t.Errorf("%s: %d of 10,000 keys got a copy on the new server", d, moved)
		}
	}
}

// TestReplicasCappedByMembers: a pool with fewer members than replicas keeps a copy on each.
func TestReplicasCappedByMembers(t *testing.T) {
	p := replicatedPool(t, "ketama", 3, "a:1", "b:1")
	if got := p.ReplicasOf([]byte("k")); len(got) != 2 || p.Replicas() != 2 {
		t.Errorf("2 members, replicas 3: %v, Replicas() %d", got, p.Replicas())
	}
}
