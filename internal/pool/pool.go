// Package pool places a key on one server of a pool (the pool's hash function, then its
// distribution: ketama, jump or modula, over the servers' names and weights), and states
// what a server is (Server: the one way to send requests, and its lifetimes). What a pool
// does when a server fails is package failover's; replication is package replica's.
package pool

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"github.com/moxi-proxy/moxi/internal/hashkit"
	"github.com/moxi-proxy/moxi/internal/ketama"
)

// Member is one server of a pool.
type Member struct {
	Name   string // ring identity and metric label; see ketama.ServerName for the default
	Addr   string // "host:port", or "embedded/N" for an in-process shard
	Weight int
	Server Server // where requests go: the server, or the features composed around it (package route)
	// Base is the server itself, under whatever is composed around it: its identity, which
	// outlives reloads (StandIns remembers keys by it). New sets it to Server when nil.
	Base Server
	// Zone is the member's zone (Options.Zones), or "": then Name is "<Zone>/<ring name>".
	Zone string
}

// EmbeddedAddr is the address of a pool's in-process shard i: unique within its pool only.
func EmbeddedAddr(i int) string { return "embedded/" + strconv.Itoa(i) }

// SameServer reports whether a and b are one server: the same remote address (two pools
// may list one memcached), or the same in-process shard.
func SameServer(a, b *Member) bool {
	if strings.HasPrefix(a.Addr, "embedded/") || strings.HasPrefix(b.Addr, "embedded/") {
		return a.Base == b.Base
	}
	return a.Addr == b.Addr
}

// Up reports whether the member's server is alive.
func (m *Member) Up() bool { return m.Server.Up() }

// Options are a pool's placement rules.
type Options struct {
	Distribution string // one of Distributions(); "" is DefaultDistribution
	Hash         string // one of twemproxy's names (hashkit.Names); "" is DefaultHash
	// HashTag is twemproxy's hash_tag: "" (the whole key is hashed) or two characters, the
	// opening and closing ones of the part of a key that is hashed (see hashedPart).
	HashTag string
	// Failover places a dead server's keys on another live server until it recovers:
	// ketama the next point of a live server, jump a rehash, modula the next live slot.
	Failover bool
	Retries  int // further attempts after a timeout or connection error
	// Replicas > 1 places each key on that many members (ReplicaSetOf); package replica
	// sends its requests to them.
	Replicas int
	// Zones, when set, places each key on one member in each zone (zones.go): as many
	// replicas as zones.
	Zones []string
	// Debts are the servers that owe a cleanup before they serve their keys again (package
	// failover's StandIns); nil: none ever does.
	Debts Debts
}

// Debts tells which servers owe a cleanup: a pool places their keys as if they were dead.
type Debts interface {
	Owes(base Server) bool
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
	zoned   *zonePicker           // the picker, with zones; nil without
	alive   func(member int) bool // Serving, made once so that lookups do not allocate
}

// New builds the pool name over members, which it keeps: whoever composes their servers
// (package topology) may change Member.Server in place until the pool is in service.
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
	for i := range members {
		if members[i].Base == nil {
			members[i].Base = members[i].Server
		}
	}
	for i, m := range members {
		if m.Weight <= 0 {
			return nil, fmt.Errorf("pool %s: server %s: weight %d", name, m.Name, m.Weight)
		}
		nodes[i] = ketama.Node{Name: m.Name, Weight: m.Weight}
	}
	if len(opts.HashTag) != 0 && len(opts.HashTag) != 2 {
		return nil, fmt.Errorf("pool %s: hash_tag %q: want two characters", name, opts.HashTag)
	}
	p := &Pool{name: name, opts: opts, members: members, hash: h}
	p.alive = p.Serving
	var pk picker
	var err error
	if len(opts.Zones) > 0 {
		if len(opts.Zones) > MaxReplicas || opts.Replicas > 1 {
			return nil, fmt.Errorf("pool %s: %d zones and %d replicas: at most %d zones, and not with replicas", name, len(opts.Zones), opts.Replicas, MaxReplicas)
		}
		p.zoned, err = newZonePicker(opts.Distribution, opts.Zones, members)
		pk = p.zoned
	} else {
		pk, err = newPicker(opts.Distribution, nodes)
	}
	if err != nil {
		return nil, fmt.Errorf("pool %s: %w", name, err)
	}
	p.picker = pk
	return p, nil
}

// Name is the pool's name from the config.
func (p *Pool) Name() string { return p.name }

// Locate is the index of the member that serves key: its owner, or with failover, while
// the owner does not serve (dead, or cleaning up after its stand-ins, see StandIns), the
// live member that stands in for it. It does not allocate.
func (p *Pool) Locate(key []byte) int {
	i, _ := p.locate(key)
	return i
}

// Placement is Locate and Owner of key from one look at the members' health: the member
// that serves key, and the one that owns it. They differ while the owner does not serve and
// another member stands in for it (failover), or, with replicas, another replica serves
// first. It does not allocate.
func (p *Pool) Placement(key []byte) (serving, owner int) { return p.locate(key) }

// locate is Locate, and the owner of key.
func (p *Pool) locate(key []byte) (i, owner int) {
	if len(p.members) == 1 {
		return 0, 0
	}
	h := p.hashOf(key)
	owner = p.picker.Pick(h)
	if p.Replicas() > 1 {
		return p.firstServing(key), owner
	}
	if !p.opts.Failover || p.Serving(owner) {
		return owner, owner
	}
	if live := p.picker.PickLive(h, p.alive); live >= 0 {
		return live, owner
	}
	return owner, owner // nobody is alive: the owner answers "dead" at once
}

// Owner is the index of the member that owns key, serving or not.
func (p *Pool) Owner(key []byte) int {
	if len(p.members) == 1 {
		return 0
	}
	return p.picker.Pick(p.hashOf(key))
}

// hashOf is key's hash; twemproxy hashes an empty key to 0.
func (p *Pool) hashOf(key []byte) uint32 {
	if len(p.opts.HashTag) == 2 {
		key = hashedPart(key, p.opts.HashTag[0], p.opts.HashTag[1])
	}
	if len(key) == 0 {
		return 0
	}
	return p.hash(key)
}

// hashedPart is the part of key that places it under a hash tag, by nutcracker's rule: the
// bytes after the first open up to the next close after it, when there are any; else
// the whole key (no open, no close after it, or nothing between them). So "{user42}:cart"
// and "{user42}:profile" land on one server.
func hashedPart(key []byte, open, close byte) []byte {
	start := bytes.IndexByte(key, open)
	if start < 0 {
		return key
	}
	end := bytes.IndexByte(key[start+1:], close)
	if end <= 0 {
		return key
	}
	return key[start+1 : start+1+end]
}

// Serving reports whether member i serves its keys: up, and owing no cleanup (Debts).
func (p *Pool) Serving(i int) bool {
	m := &p.members[i]
	return m.Up() && (p.opts.Debts == nil || !p.opts.Debts.Owes(m.Base))
}

// Retries is how many further attempts a request gets after a timeout or connection error.
func (p *Pool) Retries() int { return p.opts.Retries }

// Failover reports whether a dead server's keys go to another server.
func (p *Pool) Failover() bool { return p.opts.Failover }

// Len is the number of members.
func (p *Pool) Len() int { return len(p.members) }

// Member is the i'th member, in config order.
func (p *Pool) Member(i int) *Member { return &p.members[i] }

// Itself is p, for every key: GroupByMember's poolFor within one pool.
func (p *Pool) Itself([]byte) *Pool { return p }

// Group is the keys of a request that one member serves: their positions in the request's
// idx (see GroupByMember).
type Group struct {
	Pool   *Pool
	Member *Member
	At     []int
}

// GroupByMember groups keys[i], for each i in idx, by the member that serves it in the pool
// poolFor names for it; Group.At holds positions in idx (key indexes when idx is nil, which
// means every key). The groups come in the order their first key does. A request has few
// distinct members, so a linear scan beats a map.
func GroupByMember(poolFor func(key []byte) *Pool, keys [][]byte, idx []int) []Group {
	var groups []Group
	n := len(idx)
	if idx == nil {
		n = len(keys)
	}
	for j := range n {
		i := j
		if idx != nil {
			i = idx[j]
		}
		pl := poolFor(keys[i])
		m := pl.Member(pl.Locate(keys[i]))
		g := 0
		for g < len(groups) && groups[g].Member != m {
			g++
		}
		if g == len(groups) {
			groups = append(groups, Group{Pool: pl, Member: m})
		}
		groups[g].At = append(groups[g].At, j)
	}
	return groups
}
