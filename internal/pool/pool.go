// Package pool places a key on one server of a pool: the pool's hash function, then its
// distribution (ketama, jump or modula) over the servers' names and weights.
package pool

import (
	"fmt"

	"github.com/moxi-proxy/moxi/internal/hashkit"
	"github.com/moxi-proxy/moxi/internal/ketama"
)

// Member is one server of a pool.
type Member struct {
	Name   string // ring identity and metric label; see ketama.ServerName for the default
	Addr   string // "host:port", or "embedded/N" for an in-process shard
	Weight int
	Server Server
}

// Up reports whether the member's server is alive.
func (m *Member) Up() bool { return m.Server.Up() }

// Options are a pool's placement and failure rules.
type Options struct {
	Distribution string // one of Distributions(); "" is DefaultDistribution
	Hash         string // one of twemproxy's names (hashkit.Names); "" is DefaultHash
	// Failover sends a dead server's keys to another live server until it recovers:
	// ketama the next point of a live server, jump a rehash, modula the next live slot.
	Failover bool
	Retries  int // further attempts after a timeout or connection error
}

// picker maps a key hash to the index of the member that owns it, or that takes its keys
// while it is dead.
type picker interface {
	Pick(hash uint32) int
	PickLive(hash uint32, alive func(member int) bool) int
}

// Pool is an immutable set of servers and the rule that places keys on them. A topology
// change builds a new Pool. Safe for concurrent use.
type Pool struct {
	name    string
	opts    Options
	members []Member
	hash    hashkit.Func
	picker  picker
	alive   func(member int) bool // members[i].Up, made once so that lookups do not allocate
}

// New builds the pool name over members, which it keeps.
func New(name string, opts Options, members []Member) (*Pool, error) {
	if len(members) == 0 {
		return nil, fmt.Errorf("pool %s: no servers", name)
	}
	if opts.Hash == "" {
		opts.Hash = DefaultHash
	}
	h, ok := hashkit.Lookup(opts.Hash)
	if !ok {
		return nil, fmt.Errorf("pool %s: unknown hash %q", name, opts.Hash)
	}
	nodes := make([]ketama.Node, len(members))
	for i, m := range members {
		if m.Weight <= 0 {
			return nil, fmt.Errorf("pool %s: server %s: weight %d", name, m.Name, m.Weight)
		}
		nodes[i] = ketama.Node{Name: m.Name, Weight: m.Weight}
	}
	p := &Pool{name: name, opts: opts, members: members, hash: h}
	p.alive = func(i int) bool { return p.members[i].Up() }
	pk, err := newPicker(opts.Distribution, nodes)
	if err != nil {
		return nil, fmt.Errorf("pool %s: %w", name, err)
	}
	p.picker = pk
	return p, nil
}

// Name is the pool's name from the config.
func (p *Pool) Name() string { return p.name }

// Locate is the index of the member that serves key: its owner, or with failover, while
// the owner is dead, the live member that stands in for it. It does not allocate.
func (p *Pool) Locate(key []byte) int {
	if len(p.members) == 1 {
		return 0
	}
	var h uint32 // twemproxy hashes an empty key to 0
	if len(key) > 0 {
		h = p.hash(key)
	}
	i := p.picker.Pick(h)
	if !p.opts.Failover || p.members[i].Up() {
		return i
	}
	if live := p.picker.PickLive(h, p.alive); live >= 0 {
		return live
	}
	return i // nobody is alive: the owner answers "dead" at once
}

// Retries is how many further attempts a request gets after a timeout or connection error.
func (p *Pool) Retries() int { return p.opts.Retries }

// Failover reports whether a dead server's keys go to another server.
func (p *Pool) Failover() bool { return p.opts.Failover }

// Len is the number of members.
func (p *Pool) Len() int { return len(p.members) }

// Member is the i'th member, in config order.
func (p *Pool) Member(i int) *Member { return &p.members[i] }
