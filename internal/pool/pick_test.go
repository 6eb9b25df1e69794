package pool

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/moxi-proxy/moxi/internal/ketama"
)

func weightedNodes(weights ...int) []ketama.Node {
	ns := make([]ketama.Node, len(weights))
	for i, w := range weights {
		ns[i] = ketama.Node{Name: fmt.Sprintf("10.0.0.%d:11212", i+1), Weight: w}
	}
	return ns
}

// TestDistribution: 100,000 random hashes land on each server within ±5 % of its share
// of the total weight.
func TestDistribution(t *testing.T) {
	tests := []struct {
		name    string
		weights []int
		pick    func(weights []int) func(uint32) int
	}{
		{"jump 1,2,3", []int{1, 2, 3}, func(w []int) func(uint32) int { return NewJump(w).Pick }},
		{"jump 5,1,1,1", []int{5, 1, 1, 1}, func(w []int) func(uint32) int { return NewJump(w).Pick }},
		{"modula 1,2,3", []int{1, 2, 3}, func(w []int) func(uint32) int { return NewModula(weightedNodes(w...)).Pick }},
		{"modula 5,1,1,1", []int{5, 1, 1, 1}, func(w []int) func(uint32) int { return NewModula(weightedNodes(w...)).Pick }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pick := tt.pick(tt.weights)
			total := 0
			for _, w := range tt.weights {
				total += w
			}
			counts := make([]int, len(tt.weights))
			rng := rand.New(rand.NewPCG(7, 8))
			const n = 100000
			for range n {
				counts[pick(rng.Uint32())]++
			}
			for i, c := range counts {
				want := float64(n) * float64(tt.weights[i]) / float64(total)
				if r := float64(c) / want; r < 0.95 || r > 1.05 {
					t.Errorf("server %d (weight %d): %d keys, %.3f of its share", i, tt.weights[i], c, r)
				}
			}
		})
	}
}

// TestJumpAddServer: appending a server moves only the keys it takes over, about 1/n.
func TestJumpAddServer(t *testing.T) {
	before, after := NewJump([]int{1, 1, 1, 1}), NewJump([]int{1, 1, 1, 1, 1})
	rng := rand.New(rand.NewPCG(9, 10))
	const n = 100000
	moved := 0
	for range n {
		h := rng.Uint32()
		b, a := before.Pick(h), after.Pick(h)
		if a != b {
			moved++
			if a != 4 {
				t.Fatalf("hash %#x moved from %d to old server %d", h, b, a)
			}
		}
	}
	if f := float64(moved) / n; f < 0.19 || f > 0.21 {
		t.Errorf("%.3f of keys moved, want about 1/5", f)
	}
}

// TestModulaLayout: weight consecutive slots per server in twemproxy's name order (shorter
// names first), owner = slot[hash % total].
func TestModulaLayout(t *testing.T) {
	m := NewModula([]ketama.Node{{Name: "mc-b:11300", Weight: 2}, {Name: "mc-a:11300", Weight: 1}, {Name: "mc", Weight: 3}})
	want := []int{2, 2, 2, 1, 0, 0} // "mc", then "mc-a…", then "mc-b…"
	var got []int
	for h := range uint32(12) {
		got = append(got, m.Pick(h))
	}
	if !slices.Equal(got, append(want, want...)) {
		t.Errorf("owners of hashes 0..11 = %v, want %v twice", got, want)
	}
}

func TestPickEmpty(t *testing.T) {
	if got := NewJump(nil).Pick(1); got != -1 {
		t.Errorf("jump: %d", got)
	}
	if got := NewModula(nil).Pick(1); got != -1 {
		t.Errorf("modula: %d", got)
	}
}

func TestPickNoAllocs(t *testing.T) {
	j, m := NewJump([]int{1, 2, 3}), NewModula(weightedNodes(1, 2, 3))
	var h uint32
	if a := testing.AllocsPerRun(1000, func() { h += 0x9e3779b9; j.Pick(h) }); a != 0 {
		t.Errorf("Jump.Pick: %v allocs", a)
	}
	if a := testing.AllocsPerRun(1000, func() { h += 0x9e3779b9; m.Pick(h) }); a != 0 {
		t.Errorf("Modula.Pick: %v allocs", a)
	}
}

func BenchmarkJumpPick(b *testing.B) {
	j := NewJump([]int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1})
	b.ReportAllocs()
	var h uint32
	for b.Loop() {
		h += 0x9e3779b9
		j.Pick(h)
	}
}

func BenchmarkModulaPick(b *testing.B) {
	m := NewModula(weightedNodes(1, 1, 1, 1, 1, 1, 1, 1, 1, 1))
	b.ReportAllocs()
	var h uint32
	for b.Loop() {
		h += 0x9e3779b9
		m.Pick(h)
	}
}
