package proxy

import (
	"bytes"

	"moxi/internal/pool"
)

// Route sends keys that start with Prefix to Pool.
type Route struct {
	Prefix []byte
	Pool   *pool.Pool
}

// Topology is an immutable routing table: the pools, the prefix routes tried in order and the
// pool for every other key. A reload builds a new Topology and swaps it in whole.
type Topology struct {
	Pools   []*pool.Pool
	Routes  []Route
	Default *pool.Pool
	// Backups maps a pool to its backup pool: writes are copied there, and reads that miss
	// or fail on the pool are tried there.
	Backups map[*pool.Pool]*pool.Pool
}

// PoolFor is the pool that key routes to: the first route whose prefix it has, else Default.
func (t *Topology) PoolFor(key []byte) *pool.Pool {
	for i := range t.Routes {
		if bytes.HasPrefix(key, t.Routes[i].Prefix) {
			return t.Routes[i].Pool
		}
	}
	return t.Default
}

// Locate is the member that serves key now.
func (t *Topology) Locate(key []byte) *pool.Member {
	p := t.PoolFor(key)
	return p.Member(p.Locate(key))
}
