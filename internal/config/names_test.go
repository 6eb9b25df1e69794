package config

import (
	"fmt"
	"strings"
	"testing"

	"github.com/moxi-proxy/moxi/internal/hashkit"
	"github.com/moxi-proxy/moxi/internal/ketama"
	"github.com/moxi-proxy/moxi/internal/pool"
)

// TestIPv6Servers: every server form takes an IPv6 address in brackets, and the ring name
// the config checks duplicates by is ketama.ServerName's, the name the ring is built from.
func TestIPv6Servers(t *testing.T) {
	c := mustParse(t, `pools:
  p:
    servers:
      - "[::1]:11211"
      - "[::1]:11212:2"
      - "[::2]:11211:1 cache-c"
      - {addr: "[::3]:11213", weight: 3}
      - "[::4]:011211"
`)
	want := []struct {
		server Server
		ring   string // twemproxy's name for the same server, written "::1:11211:1" there
	}{
		{Server{Addr: "[::1]:11211", Weight: 1, Line: 4}, "::1"},
		{Server{Addr: "[::1]:11212", Weight: 2, Line: 5}, "::1:11212"},
		{Server{Name: "cache-c", Addr: "[::2]:11211", Weight: 1, Line: 6}, "cache-c"},
		{Server{Addr: "[::3]:11213", Weight: 3, Line: 7}, "::3:11213"},
		{Server{Addr: "[::4]:11211", Weight: 1, Line: 8}, "::4"},
	}
	got := c.Pools[0].Servers
	if len(got) != len(want) {
		t.Fatalf("servers = %+v", got)
	}
	for i, w := range want {
		s := got[i]
		if s != w.server {
			t.Errorf("server %d = %+v, want %+v", i, s, w.server)
		}
		if s.RingName() != w.ring {
			t.Errorf("server %d: RingName() = %q, want %q", i, s.RingName(), w.ring)
		}
		if s.Name == "" && s.RingName() != ketama.ServerName(s.Addr) {
			t.Errorf("server %d: RingName() = %q, ketama.ServerName = %q", i, s.RingName(), ketama.ServerName(s.Addr))
		}
	}
}

// TestIPv6Placement: a pool parsed from bracketed IPv6 addresses places every key where a
// ring of twemproxy's names for the same servers does.
func TestIPv6Placement(t *testing.T) {
	c := mustParse(t, "pools:\n  p:\n    servers: [\"[::1]:11211\", \"[::1]:11212:2\", \"[::2]:11300\"]\n")
	var nodes []ketama.Node
	for _, s := range c.Pools[0].Servers {
		nodes = append(nodes, ketama.Node{Name: s.RingName(), Weight: s.Weight})
	}
	twem := []ketama.Node{{Name: "::1", Weight: 1}, {Name: "::1:11212", Weight: 2}, {Name: "::2:11300", Weight: 1}}
	ours, theirs := ketama.New(nodes), ketama.New(twem)
	for i := range 100000 {
		h := hashkit.MD5(fmt.Appendf(nil, "key:%d", i))
		if a, b := ours.Pick(h), theirs.Pick(h); a != b {
			t.Fatalf("hash %d: server %d from the config, %d with twemproxy's names", h, a, b)
		}
	}
}

// TestDistributionAndHashNames ties the config to the tables it validates by: every
// distribution and hash it accepts builds a pool, and the names it lists when rejecting one
// are exactly the tables' names.
func TestDistributionAndHashNames(t *testing.T) {
	for _, dist := range pool.Distributions() {
		for _, hash := range hashkit.Names() {
			c := mustParse(t, fmt.Sprintf("pools:\n  p:\n    distribution: %s\n    hash: %s\n    servers: [h:1, h:2:2]\n", dist, hash))
			p := c.Pools[0]
			var members []pool.Member
			for _, s := range p.Servers {
				members = append(members, pool.Member{Name: s.RingName(), Addr: s.Addr, Weight: s.Weight})
			}
			if _, err := pool.New(p.Name, pool.Options{Distribution: p.Distribution, Hash: p.Hash}, members); err != nil {
				t.Errorf("%s/%s: accepted by config, rejected by pool.New: %v", dist, hash, err)
			}
		}
	}
	tests := []struct {
		key, table string
	}{
		{"distribution", strings.Join(pool.Distributions(), ", ")},
		{"hash", strings.Join(hashkit.Names(), ", ")},
	}
	for _, tt := range tests {
		_, err := Parse(fmt.Appendf(nil, "pools:\n  p:\n    embedded: 1\n    %s: nope\n", tt.key), "m.yaml")
		want := fmt.Sprintf("m.yaml:4: pools.p.%s: unknown %s \"nope\": want one of %s", tt.key, tt.key, tt.table)
		if err == nil || err.Error() != want {
			t.Errorf("%s: error %v, want %q", tt.key, err, want)
		}
	}
	if d := NewPool("p").Distribution; d != pool.DefaultDistribution {
		t.Errorf("default distribution %q, pool's %q", d, pool.DefaultDistribution)
	}
	if _, ok := hashkit.Lookup(NewPool("p").Hash); !ok {
		t.Errorf("default hash %q is not in hashkit", NewPool("p").Hash)
	}
}
