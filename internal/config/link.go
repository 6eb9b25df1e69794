package config

import (
	"strings"

	"gopkg.in/yaml.v3"
)

// link resolves the names that refer to pools (default_pool, backup, routes) once every
// pool has been read, and fills in default_pool when there is only one pool.
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
