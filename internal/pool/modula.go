package pool

import (
	"fmt"

	"github.com/moxi-proxy/moxi/internal/ketama"
)

// Modula places keys as twemproxy's "distribution: modula" does: a continuum with weight
// consecutive slots per server, and a key's owner is the slot at hash % total weight. The
// servers are laid out in twemproxy's order (ketama.Order: by name), not the config's,
// which is why it needs the names. Adding or removing a server moves most keys. A Modula
// is immutable and safe for concurrent use.
type Modula struct {
	slots []int32 // slots[i] is the index of the server owning slot i
}

// NewModula builds the continuum for nodes; Pick returns indices into nodes. It panics if
// a weight is not positive; configuration loading rejects those first.
func NewModula(nodes []ketama.Node) *Modula {
	order := ketama.Order(nodes)
	weights := make([]int, len(nodes))
	for i, j := range order {
		weights[i] = nodes[j].Weight
	}
	m := &Modula{slots: weightedSlots(weights)}
	for i, s := range m.slots {
		m.slots[i] = int32(order[s])
	}
	return m
}

// Pick returns the index of the server owning hash, or -1 when there are no servers. It
// does not allocate.
func (m *Modula) Pick(hash uint32) int {
	if len(m.slots) == 0 {
		return -1
	}
	return int(m.slots[hash%uint32(len(m.slots))])
}

// weightedSlots returns weights[i] consecutive entries i for every server i.
func weightedSlots(weights []int) []int32 {
	total := 0
	for i, w := range weights {
		if w <= 0 {
			panic(fmt.Sprintf("pool: server %d has weight %d", i, w))
		}
		total += w
	}
	slots := make([]int32, 0, total)
	for i, w := range weights {
		for range w {
			slots = append(slots, int32(i))
		}
	}
	return slots
}

// PickLive is Pick, except that a key whose owner is not alive goes to the owner of the
// next slot that is alive, so only a dead server's keys move. -1 when none is alive.
func (m *Modula) PickLive(hash uint32, alive func(server int) bool) int {
	n := uint32(len(m.slots))
	for i := range n {
		if o := int(m.slots[(hash%n+i)%n]); alive(o) {
			return o
		}
	}
	return -1
}
