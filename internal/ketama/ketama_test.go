package ketama

import (
	"crypto/md5"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestServerName(t *testing.T) {
	tests := []struct {
		name, addr, want string
	}{
		{"default port dropped", "127.0.0.1:11211", "127.0.0.1"},
		{"other port kept", "127.0.0.1:11212", "127.0.0.1:11212"},
		{"hostname default port", "mc1.example:11211", "mc1.example"},
		{"ipv6 default port", "[::1]:11211", "::1"},
		{"ipv6 other port", "[::1]:11300", "::1:11300"},
		{"ipv6 as twemproxy writes it, default port", "::1:11211", "::1"},
		{"ipv6 as twemproxy writes it, other port", "::1:11300", "::1:11300"},
		{"ipv6 with zone", "[fe80::1%eth0]:11211", "fe80::1%eth0"},
		{"port read as a number", "mc1:011211", "mc1"},
		{"no port", "mc1", "mc1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ServerName(tt.addr); got != tt.want {
				t.Errorf("ServerName(%q) = %q, want %q", tt.addr, got, tt.want)
			}
		})
	}
}

func nodes(weights ...int) []Node {
	ns := make([]Node, len(weights))
	for i, w := range weights {
		ns[i] = Node{Name: fmt.Sprintf("10.0.0.%d:11211", i+1), Weight: w}
	}
	return ns
}

func TestPointsPerNode(t *testing.T) {
	tests := []struct {
		name    string
		weights []int
		want    []int
	}{
		{"one node", []int{1}, []int{160}},
		{"equal weights", []int{1, 1, 1, 1}, []int{160, 160, 160, 160}},
		{"equal heavy weights", []int{7, 7}, []int{160, 160}},
		{"weights 1,2,3", []int{1, 2, 3}, []int{80, 160, 240}},
		{"too light for a digest", []int{1, 1000}, []int{0, 316}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := New(nodes(tt.weights...))
			got := make([]int, len(tt.weights))
			for _, o := range r.owners {
				got[o]++
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("points per node %v, want %v", got, tt.want)
			}
			if !slices.IsSorted(r.values) {
				t.Error("points not sorted")
			}
		})
	}
}

// TestPointsAreNameDigests checks a node's points are the MD5 digests of "NAME-i".
func TestPointsAreNameDigests(t *testing.T) {
	ns := []Node{{Name: "alpha", Weight: 1}, {Name: "beta", Weight: 1}}
	r := New(ns)
	for n, node := range ns {
		for i := range 40 {
			sum := md5.Sum(fmt.Appendf(nil, "%s-%d", node.Name, i))
			for x := range 4 {
				v := binary.LittleEndian.Uint32(sum[4*x:])
				j, ok := slices.BinarySearch(r.values, v)
				if !ok || r.owners[j] != int32(n) {
					t.Fatalf("point %#x of %s-%d missing or not owned by %d", v, node.Name, i, n)
				}
			}
		}
	}
}

func TestPickWrapAround(t *testing.T) {
	r := New(nodes(1, 1, 1))
	first, last := r.values[0], r.values[len(r.values)-1]
	tests := []struct {
		name string
		hash uint32
		want int32
	}{
		{"zero goes to the first point", 0, r.owners[0]},
		{"on the first point", first, r.owners[0]},
		{"just after the first point", first + 1, r.owners[1]},
		{"on the last point", last, r.owners[len(r.owners)-1]},
		{"past the last point wraps", last + 1, r.owners[0]},
		{"max hash wraps", ^uint32(0), r.owners[0]},
	}
	if last == ^uint32(0) {
		t.Fatal("ring ends at the maximum hash; wrap-around untested")
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := r.Pick(tt.hash); got != int(tt.want) {
				t.Errorf("Pick(%#x) = %d, want %d", tt.hash, got, tt.want)
			}
		})
	}
}

func TestPickFollowsWeights(t *testing.T) {
	r := New(nodes(1, 2, 3))
	counts := make([]int, 3)
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 100000
	for range n {
		counts[r.Pick(rng.Uint32())]++
	}
	for i, c := range counts {
		want := float64(n) * float64(i+1) / 6
		if share := float64(c) / want; share < 0.8 || share > 1.2 {
			t.Errorf("node %d (weight %d) got %d keys, %.2f of its share", i, i+1, c, share)
		}
	}
}

// TestAddNodeMovesOnlyItsKeys: with equal weights every node keeps its points when a node
// joins, so the only keys that move are those the new node takes.
func TestAddNodeMovesOnlyItsKeys(t *testing.T) {
	before, after := New(nodes(1, 1, 1, 1)), New(nodes(1, 1, 1, 1, 1))
	rng := rand.New(rand.NewPCG(3, 4))
	moved := 0
	for range 100000 {
		h := rng.Uint32()
		b, a := before.Pick(h), after.Pick(h)
		if a != b {
			moved++
			if a != 4 {
				t.Fatalf("hash %#x moved from %d to old node %d", h, b, a)
			}
		}
	}
	if moved < 15000 || moved > 25000 {
		t.Errorf("%d of 100000 keys moved, want about a fifth", moved)
	}
}

func TestPickLive(t *testing.T) {
	r := New(nodes(1, 1, 1, 1))
	allAlive := func(int) bool { return true }
	deadTwo := func(n int) bool { return n != 2 }
	noneAlive := func(int) bool { return false }
	rng := rand.New(rand.NewPCG(5, 6))
	sawFailover := make(map[int]bool)
	for range 10000 {
		h := rng.Uint32()
		owner := r.Pick(h)
		if got := r.PickLive(h, allAlive); got != owner {
			t.Fatalf("all alive: PickLive(%#x) = %d, Pick %d", h, got, owner)
		}
		got := r.PickLive(h, deadTwo)
		switch {
		case owner != 2 && got != owner:
			t.Fatalf("key of live node %d moved to %d", owner, got)
		case owner == 2 && got == 2:
			t.Fatalf("key went to the dead node")
		case owner == 2:
			// The next point after h's that is not node 2's.
			i := r.search(h)
			for r.owners[i%len(r.owners)] == 2 {
				i++
			}
			if want := int(r.owners[i%len(r.owners)]); got != want {
				t.Fatalf("failover of %#x went to %d, next live point is %d's", h, got, want)
			}
			sawFailover[got] = true
		}
		if got := r.PickLive(h, noneAlive); got != -1 {
			t.Fatalf("none alive: PickLive = %d", got)
		}
	}
	if len(sawFailover) != 3 {
		t.Errorf("a dead node's keys went to %v, want spread over all 3 live nodes", sawFailover)
	}
}

func TestEmptyRing(t *testing.T) {
	r := New(nil)
	if got := r.Pick(42); got != -1 {
		t.Errorf("Pick = %d", got)
	}
	if got := r.PickLive(42, func(int) bool { return true }); got != -1 {
		t.Errorf("PickLive = %d", got)
	}
}

func TestNewRejectsZeroWeight(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("no panic for weight 0")
		}
	}()
	New(nodes(1, 0))
}

func TestOrder(t *testing.T) {
	ns := []Node{{Name: "b:2"}, {Name: "a:10"}, {Name: "a:9"}, {Name: "c"}}
	if got, want := Order(ns), []int{3, 2, 0, 1}; !slices.Equal(got, want) {
		t.Errorf("Order = %v, want %v (shorter names first, then bytewise)", got, want)
	}
}

func TestPickNoAllocs(t *testing.T) {
	r := New(nodes(1, 2, 3))
	alive := func(n int) bool { return n != 1 }
	var h uint32
	if a := testing.AllocsPerRun(1000, func() { h += 0x9e3779b9; r.Pick(h) }); a != 0 {
		t.Errorf("Pick: %v allocs", a)
	}
	if a := testing.AllocsPerRun(1000, func() { h += 0x9e3779b9; r.PickLive(h, alive) }); a != 0 {
		t.Errorf("PickLive: %v allocs", a)
	}
}

func BenchmarkRingPick(b *testing.B) {
	r := New(nodes(1, 1, 1, 1, 1, 1, 1, 1, 1, 1))
	b.ReportAllocs()
	var h uint32
	for b.Loop() {
		h += 0x9e3779b9
		r.Pick(h)
	}
}

func BenchmarkRingPickLive(b *testing.B) {
	r := New(nodes(1, 1, 1, 1, 1, 1, 1, 1, 1, 1))
	alive := func(n int) bool { return n != 3 }
	b.ReportAllocs()
	var h uint32
	for b.Loop() {
		h += 0x9e3779b9
		r.PickLive(h, alive)
	}
}

func BenchmarkNew(b *testing.B) {
	ns := nodes(1, 1, 1, 1, 1, 1, 1, 1, 1, 1)
	b.ReportAllocs()
	for b.Loop() {
		New(ns)
	}
}
