package pool

import (
	"slices"

	"github.com/moxi-proxy/moxi/internal/ketama"
)

// Move is a pair of servers between which keys move when a pool's servers change: some key
// that the server at address From owned before is owned by the server at To now.
type Move struct{ From, To string }

// MovedFrom lists the moves from before, the pool's placement before a change of its
// servers, to p: every pair (before's owner, p's owner) of two ring slots — members of
// different names — at different addresses that some key has, each once. A slot that keeps
// its name keeps its keys, whatever its address (a live migration moves them, or the
// server was replaced). It is exact for ketama with the same hash, where ownership changes
// only at the points of either ring; otherwise — jump, modula, another hash or hash tag —
// it is every such pair, since any key may move.
func (p *Pool) MovedFrom(before *Pool) []Move {
	var out []Move
	add := func(from, to *Member) {
		if m := (Move{from.Addr, to.Addr}); from.Name != to.Name && from.Addr != to.Addr && !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	old, oldRing := before.picker.(*ketama.Ring)
	cur, curRing := p.picker.(*ketama.Ring)
	if !oldRing || !curRing || before.opts.Hash != p.opts.Hash || before.opts.HashTag != p.opts.HashTag {
		for i := range before.members {
			for j := range p.members {
				add(&before.members[i], &p.members[j])
			}
		}
		return out
	}
	// Ownership is constant between consecutive points of the two rings together: a hash
	// at each point and just after it sees every interval.
	check := func(h uint32) {
		add(&before.members[old.Pick(h)], &p.members[cur.Pick(h)])
	}
	check(0)
	for _, points := range [][]uint32{old.Points(), cur.Points()} {
		for _, h := range points {
			check(h)
			check(h + 1)
		}
	}
	return out
}
