package config

import (
	"cmp"
	"net"
	"strings"

	"gopkg.in/yaml.v3"
)

// link resolves the names that refer to pools (default_pool, backup, routes, warm_from,
// shadow.pool) once every pool has been read, and fills in default_pool when there is only
// one pool.
func (d *decoder) link(c *Config, l *links) {
	if len(c.Pools) == 0 {
		// A pools value of the wrong kind has been reported already.
		if l.pools == nil || isNull(l.pools) || l.pools.Kind == yaml.MappingNode {
			d.fail(l.poolsKey, "pools", "at least one pool is required")
		}
		return
	}

	switch {
	case l.defaultPool != nil:
		if c.Pool(c.DefaultPool) == nil {
			d.fail(l.defaultPool, "default_pool", "no pool named %q", c.DefaultPool)
		}
	case len(c.Pools) == 1:
		c.DefaultPool = c.Pools[0].Name
	default:
		d.fail(l.poolsKey, "default_pool", "required when there is more than one pool")
	}

	d.linkListeners(c, l)
	for i, name := range c.Readiness.Pools {
		if c.Pool(name) == nil && i < len(l.readiness) {
			d.fail(l.readiness[i], index("readiness.pools", i), "no pool named %q", name)
		}
	}
	for i, r := range c.Routes {
		if c.Pool(r.Pool) == nil {
			d.fail(l.routePools[i], index("routes", i)+".pool", "no pool named %q", r.Pool)
		}
	}

	for _, p := range c.Pools {
		n := l.backups[p.Name]
		if n == nil {
			continue
		}
		at := "pools." + p.Name + ".backup"
		switch {
		case p.Backup == p.Name:
			d.fail(n, at, "a pool cannot back up to itself")
		case c.Pool(p.Backup) == nil:
			d.fail(n, at, "no pool named %q", p.Backup)
		default:
			if cycle := backupCycle(c, p); cycle != nil {
				d.fail(n, at, "backup cycle: %s", strings.Join(cycle, " -> "))
			}
		}
	}
	for _, p := range c.Pools {
		if n := l.warmFrom[p.Name]; n != nil {
			at := "pools." + p.Name + ".warm_from"
			other := c.Pool(p.WarmFrom)
			switch {
			case p.WarmFrom == p.Name:
				d.fail(n, at, "a pool cannot warm up from itself")
			case other == nil:
				d.fail(n, at, "no pool named %q", p.WarmFrom)
			case other.WarmFrom != "":
				// A miss is read from one other pool, never along a chain: name the pool
				// that holds the data.
				d.fail(n, at, "pool %s warms up from %s itself: chains are not followed, warm up from the pool that holds the data", other.Name, other.WarmFrom)
			case other.SASL != nil:
				// A warm-up reads its source with meta commands, which such servers refuse.
				d.fail(n, at, "pool %s has sasl: its servers speak only the binary protocol, and a warm-up reads in the text protocol", other.Name)
			}
		}
		if n := l.shadows[p.Name]; n != nil && p.Shadow != nil {
			at := "pools." + p.Name + ".shadow.pool"
			if pn := shadowPoolNode(n); pn != nil {
				n = pn
			}
			switch {
			case p.Shadow.Pool == p.Name:
				d.fail(n, at, "a pool cannot shadow to itself")
			case c.Pool(p.Shadow.Pool) == nil:
				d.fail(n, at, "no pool named %q", p.Shadow.Pool)
			}
		}
	}
}

// linkListeners completes the listeners: each default pool exists (the config's when none
// is given), each address is listened on once, and a tls section takes the fields it
// leaves out from the top-level tls.
func (d *decoder) linkListeners(c *Config, l *links) {
	listened := map[string]string{c.Listen: "listen"}
	for i := range c.Listeners {
		ln, nodes, at := &c.Listeners[i], l.listeners[i], index("listeners", i)
		if earlier, ok := listened[ln.Listen]; ok {
			d.fail(nodes.entry, join(at, "listen"), "%s is already listened on by %s", ln.Listen, earlier)
		}
		listened[ln.Listen] = at
		switch {
		case nodes.defaultPool == nil:
			ln.DefaultPool = c.DefaultPool
		case c.Pool(ln.DefaultPool) == nil:
			d.fail(nodes.defaultPool, join(at, "default_pool"), "no pool named %q", ln.DefaultPool)
		}
		if t := ln.TLS; t != nil {
			if top := c.TLS; top != nil {
				t.Cert = cmp.Or(t.Cert, top.Cert)
				t.Key = cmp.Or(t.Key, top.Key)
				t.ClientCA = cmp.Or(t.ClientCA, top.ClientCA)
			}
			d.requireCert(t, nodes.tls, join(at, "tls"), nil)
		}
	}
}

// shadowPoolNode is the value of pool in a shadow mapping, or nil.
func shadowPoolNode(m *yaml.Node) *yaml.Node {
	m = deref(m)
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == "pool" {
			return deref(m.Content[i+1])
		}
	}
	return nil
}

// backupCycle returns the chain of backups from p back to p when p starts a cycle of two
// or more pools, p being the cycle's first pool in file order so that each cycle is
// reported once; else nil. A miss retried on the backup's backup must end somewhere.
func backupCycle(c *Config, p *Pool) []string {
	first := map[string]int{}
	for i, q := range c.Pools {
		first[q.Name] = i
	}
	chain := []string{p.Name}
	for cur := c.Pool(p.Backup); cur != nil && len(chain) <= len(c.Pools); cur = c.Pool(cur.Backup) {
		chain = append(chain, cur.Name)
		if cur == p {
			return chain
		}
		if first[cur.Name] < first[p.Name] || cur.Backup == cur.Name {
			return nil
		}
	}
	return nil
}

// CheckLoops reports a server (or migrate_from) that is one of moxi's own listen
// addresses: every request for its keys would come back to moxi, and again, until the
// connections run out. Call it once the flags that set listen have been applied: the
// file alone does not say where moxi listens. filename is used only in messages.
func (c *Config) CheckLoops(filename string) error {
	d := &decoder{file: filename}
	own := []string{c.Listen}
	for _, l := range c.Listeners {
		own = append(own, l.Listen)
	}
	for _, p := range c.Pools {
		for i, s := range p.Servers {
			for _, addr := range []string{s.Addr, s.MigrateFrom} {
				for _, listen := range own {
					if addr != "" && sameEndpoint(listen, addr) {
						d.fail(&yaml.Node{Line: s.Line}, index("pools."+p.Name+".servers", i),
							"%s is moxi's own listen address %s: its keys' requests would come back to moxi, endlessly", addr, listen)
					}
				}
			}
		}
	}
	return d.err()
}

// sameEndpoint reports whether a server at addr is reached on listen: the same port, and
// the same host, or listen on every interface, or both on the loopback interface.
func sameEndpoint(listen, addr string) bool {
	if UnixSocket(listen) {
		return false
	}
	lh, lp, err1 := net.SplitHostPort(listen)
	ah, ap, err2 := net.SplitHostPort(addr)
	if err1 != nil || err2 != nil || lp != ap {
		return false
	}
	loopback := func(h string) bool {
		ip := net.ParseIP(h)
		return h == "localhost" || ip != nil && ip.IsLoopback()
	}
	anyHost := lh == "" || net.ParseIP(lh) != nil && net.ParseIP(lh).IsUnspecified()
	return anyHost || strings.EqualFold(lh, ah) || loopback(lh) && loopback(ah)
}
