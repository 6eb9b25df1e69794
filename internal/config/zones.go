package config

import (
	"fmt"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/moxi-proxy/moxi/internal/pool"
)

// zones reads a pool's zones: an ordered list of {name, servers | discover}, each a full
// copy of the pool on a ring of its own. Their servers become the pool's, zone by zone, each
// knowing its zone (a discovered zone's come from discovery: discover.Set.Fill); a zone
// without servers, a zone named twice and a server listed twice (in any zone) are errors.
func (d *decoder) zones(p *Pool, v *yaml.Node, path string) {
	if v.Kind != yaml.SequenceNode {
		d.fail(v, path, "want a list of {name, servers}, got %s", describe(v))
		d.bad[v] = true
		return
	}
	n := len(d.errs) + d.dropped
	if len(v.Content) > pool.MaxReplicas {
		d.fail(v, path, "%d zones: at most %d", len(v.Content), pool.MaxReplicas)
	}
	names := map[string]int{}
	addrs := map[string]int{}
	var servers []Server
	for i, e := range v.Content {
		e = deref(e)
		at := index(path, i)
		var name string
		var list []Server
		var disc *Discover
		seen := d.mapping(e, at, map[string]field{
			"name":     d.zoneName(&name, false),
			"servers":  d.servers(&list),
			"discover": func(v *yaml.Node, path string) { disc = d.discover(v, path, serversDiscover) },
		})
		if e.Kind != yaml.MappingNode {
			continue
		}
		if name == "" {
			if seen["name"] == nil {
				d.fail(e, join(at, "name"), "required: the zone's name, as --zone names it")
			}
			continue
		}
		if line, dup := names[name]; dup {
			d.fail(seen["name"], join(at, "name"), "zone %q named twice (first at line %d)", name, line)
			continue
		}
		names[name] = e.Line
		switch dv := seen["discover"]; {
		case dv != nil && d.bad[dv]:
			continue // reported
		case disc != nil && seen["servers"] != nil:
			d.fail(dv, join(at, "discover"), "is instead of servers: give one")
			continue
		case disc != nil:
			if p.ZoneDiscover == nil {
				p.ZoneDiscover = map[string]*Discover{}
			}
			p.ZoneDiscover[name] = disc
			p.Zones = append(p.Zones, name)
			continue
		case len(list) == 0:
			if sv := seen["servers"]; sv == nil || !d.bad[sv] {
				d.fail(e, join(at, "servers"), "zone %q has no servers", name)
			}
			continue
		}
		for j, s := range list {
			if line, dup := addrs[s.Addr]; dup {
				d.fail(e, join(at, index("servers", j)), "duplicate server address %s (first at line %d)", s.Addr, line)
				continue
			}
			addrs[s.Addr] = s.Line
			s.Zone = name
			servers = append(servers, s)
		}
		p.Zones = append(p.Zones, name)
	}
	if len(d.errs)+d.dropped != n {
		d.bad[v] = true
		return
	}
	p.Servers = servers
}

// zoneName reads a zone's name: a word without white space or slashes (a server's name in
// the pool is "<zone>/<server>"); empty only where allowEmpty (the top-level zone: none).
func (d *decoder) zoneName(dst *string, allowEmpty bool) field {
	return func(v *yaml.Node, path string) {
		if !d.scalar(v, path) {
			return
		}
		switch name := v.Value; {
		case name == "" && allowEmpty:
		case name == "":
			d.fail(v, path, "must not be empty")
		default:
			if err := CheckZoneName(name); err != nil {
				d.fail(v, path, "%v", err)
				return
			}
			*dst = name
		}
	}
}

// CheckZoneName says why name cannot name a zone (a config's, --zone's, MOXI_ZONE's), or nil.
func CheckZoneName(name string) error {
	if strings.ContainsAny(name, "/ \t\r\n") {
		return fmt.Errorf("%q: a zone's name has no white space or slash", name)
	}
	return nil
}
