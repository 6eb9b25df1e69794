package pool

// MaxReplicas is the most replicas a pool may keep of a key (pools.*.replicas).
const MaxReplicas = 8

// ReplicaSet is the members that hold a key, in ring order: its owner, then the live-pick
// of the distribution over the members not yet chosen, so that they do not depend on
// which servers are alive. Package replica sends a replicated pool's requests to them.
type ReplicaSet struct {
	N   int
	Idx [MaxReplicas]int
}

// Has reports whether member m is in the set.
func (s *ReplicaSet) Has(m int) bool {
	for _, i := range s.Idx[:s.N] {
		if i == m {
			return true
		}
	}
	return false
}

// ReplicaSetOf is the members that hold key. It does not allocate.
func (p *Pool) ReplicaSetOf(key []byte) ReplicaSet { return p.replicasAt(p.hashOf(key)) }

// replicasAt is ReplicaSetOf a key of hash h; a pool without replicas gives the owner alone.
func (p *Pool) replicasAt(h uint32) ReplicaSet {
	if p.zoned != nil {
		return p.zoned.set(h)
	}
	var s ReplicaSet
	n := min(p.opts.Replicas, len(p.members), MaxReplicas)
	s.Idx[0], s.N = p.picker.Pick(h), 1
	notChosen := func(m int) bool { return !s.Has(m) }
	for s.N < n {
		next := p.picker.PickLive(h, notChosen)
		if next < 0 {
			break
		}
		s.Idx[s.N] = next
		s.N++
	}
	return s
}

// firstServing is the first of key's replicas that serves, or its owner when none does (it
// answers "dead" at once).
func (p *Pool) firstServing(key []byte) int {
	s := p.ReplicaSetOf(key)
	for _, i := range s.Idx[:s.N] {
		if p.Serving(i) {
			return i
		}
	}
	return s.Idx[0]
}

// Replicas is the number of members that hold each key: 1 for a pool without replication.
func (p *Pool) Replicas() int {
	if p.zoned != nil {
		return len(p.opts.Zones)
	}
	return max(1, min(p.opts.Replicas, len(p.members)))
}

// ReplicasOf is the indexes of the members that hold key, in ring order.
func (p *Pool) ReplicasOf(key []byte) []int {
	s := p.ReplicaSetOf(key)
	return append([]int(nil), s.Idx[:s.N]...)
}
