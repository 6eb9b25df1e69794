// Package pool places a key on one server of a pool: the pool's hash function, then its
// distribution (ketama, jump or modula) over the servers' names and weights.
package pool

import (
	"fmt"

	"moxi/internal/hashkit"
	"moxi/internal/ketama"
)

// Member is one server of a pool.
type Member struct {
	Name   string // ring identity and metric label; see ketama.ServerName for the default
	Addr   string // "host:port", or "embedded/N" for an in-process shard
	Weight int
	Server Server
}

// picker maps a key hash to the index of the member that owns it.
type picker interface {
	Pick(hash uint32) int
}

// Pool is an immutable set of servers and the rule that places keys on them. A topology
// change builds a new Pool. Safe for concurrent use.
type Pool struct {
	name    string
	members []Member
	hash    hashkit.Func
	picker  picker
}

// New builds the pool name with the given distribution ("ketama", "jump" or "modula") and
// hash (one of twemproxy's names, see hashkit.Names) over members, which it keeps.
func New(name, distribution, hash string, members []Member) (*Pool, error) {
	if len(members) == 0 {
		return nil, fmt.Errorf("pool %s: no servers", name)
	}
	h, ok := hashkit.Lookup(hash)
	if !ok {
		return nil, fmt.Errorf("pool %s: unknown hash %q", name, hash)
	}
	weights := make([]int, len(members))
	nodes := make([]ketama.Node, len(members))
	for i, m := range members {
		if m.Weight <= 0 {
			return nil, fmt.Errorf("pool %s: server %s: weight %d", name, m.Name, m.Weight)
		}
		weights[i] = m.Weight
		nodes[i] = ketama.Node{Name: m.Name, Weight: m.Weight}
	}
	p := &Pool{name: name, members: members, hash: h}
	switch distribution {
	case "ketama", "":
		p.picker = ketama.New(nodes)
	case "jump":
		p.picker = NewJump(weights)
	case "modula":
		p.picker = NewModula(nodes)
	default:
		return nil, fmt.Errorf("pool %s: unknown distribution %q", name, distribution)
	}
	return p, nil
}

// Name is the pool's name from the config.
func (p *Pool) Name() string { return p.name }

// Locate is the index of the member that owns key. It does not allocate.
func (p *Pool) Locate(key []byte) int {
	if len(p.members) == 1 {
		return 0
	}
	if len(key) == 0 {
		return p.picker.Pick(0) // twemproxy hashes an empty key to 0
	}
	return p.picker.Pick(p.hash(key))
}

// Len is the number of members.
func (p *Pool) Len() int { return len(p.members) }

// Member is the i'th member, in config order.
func (p *Pool) Member(i int) *Member { return &p.members[i] }
