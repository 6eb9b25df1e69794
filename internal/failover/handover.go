package failover

import "github.com/moxi-proxy/moxi/internal/pool"

// Handing what StandIns remembers to a successor process (an upgrade in place): the keys
// each server owes, named by pool and member rather than by server objects, which are the
// process's own.

// Owed is what one server owes before it serves again, as Export gives it.
type Owed struct {
	Pool   string    `json:"pool"`
	Server string    `json:"server"` // the member's name
	Flush  bool      `json:"flush,omitempty"`
	Keys   []OwedKey `json:"keys"`
}

// OwedKey is a key written without its server: to the stand-in named StandIn, or, for a
// replica away, to none ("").
type OwedKey struct {
	Key     []byte `json:"key"`
	StandIn string `json:"stand_in,omitempty"`
}

// Export is every key owed now, a cleanup's round in progress included. name names a
// server (a member's Base) by its pool and member name; a server it does not know (one a
// reload removed) is left out.
func (l *StandIns) Export(name func(pool.Server) (poolName, member string, ok bool)) []Owed {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Owed
	for home, d := range l.owed {
		p, member, ok := name(home)
		if !ok {
			continue
		}
		o := Owed{Pool: p, Server: member, Flush: d.flush}
		add := func(keys map[string]pool.Server) {
			for k, s := range keys {
				owed := OwedKey{Key: []byte(k)}
				if s != nil {
					if _, owed.StandIn, _ = name(s); owed.StandIn == "" {
						continue
					}
				}
				o.Keys = append(o.Keys, owed)
			}
		}
		add(d.cur.keys)
		add(d.deleting)
		out = append(out, o)
	}
	return out
}

// Import remembers owed, a predecessor's Export, as if its stand-in writes had been made
// here: each server owes its keys before it serves again. server finds a server by pool
// and member name (nil: unknown, left out). It returns the keys remembered.
func (l *StandIns) Import(owed []Owed, server func(poolName, member string) pool.Server) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, o := range owed {
		home := server(o.Pool, o.Server)
		if home == nil {
			continue
		}
		d := l.owe(home, o.Pool, o.Server)
		d.flush = d.flush || o.Flush
		for _, k := range o.Keys {
			var standIn pool.Server
			if k.StandIn != "" {
				if standIn = server(o.Pool, k.StandIn); standIn == nil {
					continue
				}
			}
			if _, ok := d.cur.keys[string(k.Key)]; ok {
				continue
			}
			if l.n >= l.max {
				d.flush = d.flush || standIn == nil
				l.forgotten.Add(1)
				continue
			}
			d.cur.keys[string(k.Key)] = standIn
			l.n++
			n++
		}
	}
	return n
}
