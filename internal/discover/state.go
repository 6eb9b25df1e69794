package discover

import (
	"slices"
	"strings"
	"time"

	"github.com/moxi-proxy/moxi/internal/config"
)

// Handing the lists to a successor process (an upgrade in place). A successor that asked
// afresh would drop at once a server pending removal, or one that blinks out of the
// answers during the upgrade, and would count remove_after again from the upgrade.

// PoolState is what a Set knows of one followed pool or discovered zone, as Export gives
// it and Import takes it. Times are durations before Export, so that no instant of one
// process's clock reaches the other.
type PoolState struct {
	Name string `json:"name"` // the pool's name, or "<pool>/<zone>" for a discovered zone
	// Kind is what the pool asked: "a" (A/AAAA records), "srv", or "config_endpoint
	// <host:port>". A state seeds only a pool that asks the same: A and SRV answers name
	// their servers differently, and an endpoint's versions count only at that endpoint.
	Kind    string        `json:"kind"`
	Servers []ServerState `json:"servers"` // in service, ordered by ring name
	// Missing is, by ring name, how long the answers had lacked each server of Servers
	// that they lacked.
	Missing map[string]time.Duration `json:"missing_ns,omitempty"`
	Version int64                    `json:"version,omitempty"` // a configuration endpoint's: Servers' version
}

// ServerState is a discovered server: the fields of a config.Server that discovery sets.
type ServerState struct {
	Name   string `json:"name,omitempty"` // the ring name; "": the ring derives it from Addr
	Addr   string `json:"addr"`
	Weight int    `json:"weight"`
}

// kind is what dc asks, as PoolState.Kind names it.
func kind(dc config.Discover) string {
	switch {
	case dc.ConfigEndpoint != "":
		return "config_endpoint " + dc.ConfigEndpoint
	case dc.SRV:
		return "srv"
	}
	return "a"
}

// Export is, for a successor's Import, the list in service of every followed pool and
// zone that has had an answer, with how long each server missing from the answers has
// been; ordered by name. The result is the caller's.
func (s *Set) Export() []PoolState {
	var out []PoolState
	for _, p := range s.pools {
		if st, ok := p.export(s.now); ok {
			out = append(out, st)
		}
	}
	slices.SortFunc(out, func(a, b PoolState) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func (p *pool) export(now func() time.Time) (PoolState, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.answered {
		return PoolState{}, false
	}
	st := PoolState{Name: p.name, Kind: kind(p.opts), Version: p.version}
	for _, sv := range p.servers {
		st.Servers = append(st.Servers, ServerState{Name: sv.Name, Addr: sv.Addr, Weight: sv.Weight})
	}
	// Read under p.mu: a clock read before it could precede a since that poll sets meanwhile.
	t := now()
	for name, since := range p.missing {
		if st.Missing == nil {
			st.Missing = map[string]time.Duration{}
		}
		st.Missing[name] = t.Sub(since)
	}
	return st, true
}

// Import seeds the Set's pools with states, a predecessor's Export, as if they had
// answered with them: Pending no longer names them, Wait does not wait for them, Fill
// fills their lists, and the next answer merges into the list as it would have in the
// predecessor, so a server missing there for d is removed remove_after-d later. A state is
// left out when its pool is no longer followed, is followed by asking something else
// (Kind), or has answered already (that answer is newer). Call it before Run; it is safe
// for concurrent use all the same. states is not modified.
func (s *Set) Import(states []PoolState) {
	for _, st := range states {
		if p := s.pools[st.Name]; p != nil && st.Kind == kind(p.opts) && len(st.Servers) > 0 {
			p.seed(st, s.now)
		}
	}
}

func (p *pool) seed(st PoolState, now func() time.Time) {
	servers := make([]config.Server, len(st.Servers))
	for i, sv := range st.Servers {
		servers[i] = config.Server{Name: sv.Name, Addr: sv.Addr, Weight: sv.Weight}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.answered {
		return
	}
	t := now()
	for _, sv := range servers {
		if d, ok := st.Missing[sv.RingName()]; ok {
			p.missing[sv.RingName()] = t.Add(-max(d, 0))
		}
	}
	p.servers, p.version, p.answered = servers, st.Version, true
	close(p.ready)
}
