package pool

import (
	"slices"
)

// Move is a pair of servers between which keys move when a pool's servers change: some key
// that the server at address From owned before is owned by the server at To now.
type Move struct{ From, To string }

// pointed is a placement whose ownership is constant between consecutive points: a ketama
// ring, or zones of ketama rings.
type pointed interface{ Points() []uint32 }

// MovedFrom lists the moves from before, the pool's placement before a change of its
// servers, to p: every pair (before's owner, p's owner) of two ring slots — members of
// different names — at different addresses that some key has, each once; with replicas,
// every pair of PairedFrom. A slot that keeps
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
	old, oldRing := before.picker.(pointed)
	cur, curRing := p.picker.(pointed)
	if oldRing && curRing && (old.Points() == nil || cur.Points() == nil) {
		oldRing, curRing = false, false // zones of another distribution than ketama
	}
	if !oldRing || !curRing || before.opts.Hash != p.opts.Hash || before.opts.HashTag != p.opts.HashTag {
		for i := range before.members {
			for j := range p.members {
				add(&before.members[i], &p.members[j])
			}
		}
		return out
	}
	// Ownership, and the replicas that follow an owner, are constant between consecutive
	// points of the two rings together: a hash at each point and just after it sees every
	// interval.
	check := func(h uint32) {
		p.pairs(before, before.replicasAt(h), p.replicasAt(h), add)
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

// PairedFrom is, while the keys of a pool move from before to p, the server (address) whose
// copy of key the server at address to takes over, if any. Without replicas that is key's
// owner before when its owner now is at to (another slot, at another address). With
// replicas, a key's replicas before that are not its replicas now (by slot name) each hand
// their copy over to one of its replicas now: those that were not before, in ring order,
// then (when the pool keeps fewer replicas than before) the others. So every server that
// loses a key has one that takes it over, reads through from it and deletes it there.
func (p *Pool) PairedFrom(before *Pool, key []byte, to string) (string, bool) {
	if p.Replicas() == 1 && before.Replicas() == 1 {
		from, cur := before.Member(before.Owner(key)), p.Member(p.Owner(key))
		if cur.Addr == to && from.Name != cur.Name && from.Addr != cur.Addr {
			return from.Addr, true
		}
		return "", false
	}
	var from string
	found := false
	p.pairs(before, before.ReplicaSetOf(key), p.ReplicaSetOf(key), func(f, t *Member) {
		if !found && t.Addr == to {
			from, found = f.Addr, true
		}
	})
	return from, found
}

// pairs calls visit(from, to) for each member of before in was, a key's replicas before,
// that is not in is, its replicas in p (by name), with the member of p that takes its copy
// over (see PairedFrom), unless both are at one address.
func (p *Pool) pairs(before *Pool, was, is ReplicaSet, visit func(from, to *Member)) {
	holds := func(pl *Pool, s *ReplicaSet, name string) bool {
		for _, i := range s.Idx[:s.N] {
			if pl.members[i].Name == name {
				return true
			}
		}
		return false
	}
	var takers [MaxReplicas]int
	n := 0
	for _, new := range []bool{true, false} {
		for _, i := range is.Idx[:is.N] {
			if holds(before, &was, p.members[i].Name) != new {
				takers[n] = i
				n++
			}
		}
	}
	g := 0
	for _, i := range was.Idx[:was.N] {
		from := &before.members[i]
		if holds(p, &is, from.Name) {
			continue
		}
		to := &p.members[takers[g%n]]
		g++
		if from.Addr != to.Addr {
			visit(from, to)
		}
	}
}
