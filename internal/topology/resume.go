package topology

import (
	"cmp"
	"slices"

	"github.com/moxi-proxy/moxi/internal/migrate"
)

// A process that upgrades in place hands its successor what its keys are doing (Moving),
// and the successor's Builder takes it up (Resume) before its first Build: otherwise the
// keys of a reshard not yet copied would be read from their new servers only, and miss,
// and a server that came back empty would stay so but for what reads repair.

// MovingState is what a Builder's committed topology is moving: its pools' unfinished
// reshards and its running rebuilds. It holds values only, for JSON.
type MovingState struct {
	Reshards []ReshardState `json:"reshards,omitempty"`
	Rebuilds []RebuildState `json:"rebuilds,omitempty"`
}

// ReshardState is a pool's reshard whose keys are still moving.
type ReshardState struct {
	Pool   string    `json:"pool"`
	Name   string    `json:"name"`   // reshard-<n>
	Before Placement `json:"before"` // the placement its keys move from
}

// RebuildState is a rebuild of a server of a replicated pool.
type RebuildState struct {
	Pool   string `json:"pool"`
	Server string `json:"server"` // the refilled member's name
	Addr   string `json:"addr"`   // and its address: a server moved elsewhere is not this one
	Name   string `json:"name"`   // rebuild-<n>
	Lock   string `json:"lock"`   // the tier lock's key, which names one rebuilder of the tier
	// Holder is the process that exported it, as the lock names its holder: a successor
	// takes the lock over from it at once rather than wait for it to expire.
	Holder string `json:"holder,omitempty"`
}

// Moving is what the committed topology is moving, for a successor's Resume. Safe to call
// while the Builder serves.
func (b *Builder) Moving() MovingState {
	b.mu.Lock()
	defer b.mu.Unlock()
	var st MovingState
	for name, pl := range b.placements {
		if run := pl.reshard; run != nil && !b.reshardDone(name, run.name) {
			st.Reshards = append(st.Reshards, ReshardState{Pool: name, Name: run.name, Before: run.from})
		}
	}
	slices.SortFunc(st.Reshards, func(a, b ReshardState) int { return cmp.Compare(a.Pool, b.Pool) })
	for _, r := range b.rebuilds {
		if !r.Done() {
			s := r.Status()
			st.Rebuilds = append(st.Rebuilds, RebuildState{Pool: s.Pool, Server: s.Server, Addr: s.To, Name: s.Name, Lock: r.lock, Holder: migrate.LockOwner()})
		}
	}
	return st
}

// Resume makes a new Builder go on with what its predecessor was moving (the
// predecessor's Moving); call it before the first Build. The Builder then takes each
// reshard's pool as committed at Before, the reshard not yet begun: the first Build
// reshards a pool whose servers differ from Before as a reload would, under the same name,
// and a pool placed as Before, or gone, not at all. The first Commit starts each rebuild
// again whose server is still in its replicated pool at the same address, under its name
// and lock: its copy adds, so copying twice is safe, and the lock keeps one rebuilder per
// tier. Later reshards and rebuilds count on from the names handed; a reshard whose Before
// places nothing is logged and skipped. st is the Builder's once handed.
func (b *Builder) Resume(st MovingState) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range st.Reshards {
		n := runNumber(reshardKind, r.Name)
		before, err := r.Before.newPool(r.Pool)
		if n == 0 || err != nil {
			b.logger().Warn("upgrade: a reshard handed over is not resumed", "pool", r.Pool, "reshard", r.Name, "err", err)
			continue
		}
		if b.placements == nil {
			b.placements = map[string]placing{}
		}
		if b.reshards == nil {
			b.reshards = map[string]int{}
		}
		b.placements[r.Pool] = placing{placement: r.Before, pool: before}
		b.reshards[r.Pool] = n - 1
	}
	b.resumed = &st
}

// resumeLocked finishes Resume at the first Commit, with b.mu held: the rebuilds start on
// the committed servers, and a pool that did not reshard again still counts on from its
// predecessor's reshard.
func (b *Builder) resumeLocked() {
	if b.resumed == nil {
		return
	}
	for _, r := range b.resumed.Reshards {
		b.reshards[r.Pool] = max(b.reshards[r.Pool], runNumber(reshardKind, r.Name))
	}
	for _, r := range b.resumed.Rebuilds {
		b.rebuildLocked(r)
	}
	b.resumed = nil
}
