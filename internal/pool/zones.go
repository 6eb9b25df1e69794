package pool

import (
	"fmt"
	"slices"
	"strings"

	"github.com/moxi-proxy/moxi/internal/ketama"
)

// Zones (pools.*.zones). A pool with zones keeps one copy of each key in each zone: its
// members are the zones' servers, each with its Zone, named "<zone>/<ring name>", and each
// zone places keys on its own members exactly as a pool of those servers alone would (its
// own ring, over the ring names). A key's ReplicaSet is its member in each zone, in the
// zones' listed order; package replica does the rest, as for replicas.

// zonePicker places keys zone by zone: zones[z] over the members members[z].
type zonePicker struct {
	zones   []picker
	members [][]int // per zone, the pool's indexes of its members, in the zone's ring order
}

// newZonePicker builds each zone's picker over its members.
func newZonePicker(distribution string, zones []string, members []Member) (*zonePicker, error) {
	zp := &zonePicker{zones: make([]picker, len(zones)), members: make([][]int, len(zones))}
	nodes := make([][]ketama.Node, len(zones))
	for i, m := range members {
		z := slices.Index(zones, m.Zone)
		if z < 0 {
			return nil, fmt.Errorf("server %s: zone %q is not one of the pool's zones %v", m.Name, m.Zone, zones)
		}
		zp.members[z] = append(zp.members[z], i)
		nodes[z] = append(nodes[z], ketama.Node{Name: strings.TrimPrefix(m.Name, m.Zone+"/"), Weight: m.Weight})
	}
	for z := range zones {
		if len(nodes[z]) == 0 {
			return nil, fmt.Errorf("zone %s has no servers", zones[z])
		}
		pk, err := newPicker(distribution, nodes[z])
		if err != nil {
			return nil, err
		}
		zp.zones[z] = pk
	}
	return zp, nil
}

// Pick is the key's member in the first zone listed: its owner, for what asks one.
func (zp *zonePicker) Pick(h uint32) int { return zp.members[0][zp.zones[0].Pick(h)] }

// PickLive is the first zone's live pick.
func (zp *zonePicker) PickLive(h uint32, alive func(member int) bool) int {
	m := zp.members[0]
	if i := zp.zones[0].PickLive(h, func(j int) bool { return alive(m[j]) }); i >= 0 {
		return m[i]
	}
	return -1
}

// set is the key's member in each zone, in listed order.
func (zp *zonePicker) set(h uint32) ReplicaSet {
	var s ReplicaSet
	for z, pk := range zp.zones {
		s.Idx[z] = zp.members[z][pk.Pick(h)]
	}
	s.N = len(zp.zones)
	return s
}

// Points are every zone's ring points (ketama zones): ownership in every zone is constant
// between consecutive ones, which is what MovedFrom walks. nil when a zone has no ring.
func (zp *zonePicker) Points() []uint32 {
	var out []uint32
	for _, pk := range zp.zones {
		r, ok := pk.(*ketama.Ring)
		if !ok {
			return nil
		}
		out = append(out, r.Points()...)
	}
	return out
}

// Zones is the pool's zones in listed order; nil without.
func (p *Pool) Zones() []string { return p.opts.Zones }

// ZoneOf is the index in Zones of member i's zone; -1 without zones.
func (p *Pool) ZoneOf(i int) int { return slices.Index(p.opts.Zones, p.members[i].Zone) }
