package config

import (
	"strings"
	"testing"
	"time"
)

// TestDiscover: a discover section's defaults, its round trip (the discovered servers a
// comment), and the mistakes reported at their line.
func TestDiscover(t *testing.T) {
	c := mustParse(t, "pools:\n  main:\n    discover: {dns: mc.test, srv: true}\n")
	want := Discover{DNS: "mc.test", Port: 11211, SRV: true, Interval: 10 * time.Second, RemoveAfter: time.Minute}
	if got := c.Pools[0].Discover; got == nil || *got != want || len(c.Pools[0].Servers) != 0 {
		t.Fatalf("discover %+v, servers %v; want %+v and none", got, c.Pools[0].Servers, want)
	}
	c.Pools[0].Servers = []Server{{Name: "mc-0.mc.test", Addr: "10.0.0.7:11211", Weight: 2}, {Addr: "10.0.0.8:11211", Weight: 1}}
	b, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "discover: # discovered: 10.0.0.7:11211:2 mc-0.mc.test, 10.0.0.8:11211\n") {
		t.Errorf("the discovered servers are not shown:\n%s", b)
	}
	back := mustParse(t, string(b))
	if got := back.Pools[0].Discover; got == nil || *got != want || len(back.Pools[0].Servers) != 0 {
		t.Errorf("round trip: discover %+v, servers %v", got, back.Pools[0].Servers)
	}

	for _, tt := range []struct{ name, src, want string }{
		{"no dns", "pools:\n  p:\n    discover: {port: 1}\n", "m.yaml:3: pools.p.discover.dns: required: the name whose records are this pool's servers (or config_endpoint)"},
		{"dns and a config endpoint", "pools:\n  p:\n    discover: {dns: a.test, config_endpoint: \"c.test:11211\"}\n",
			"m.yaml:3: pools.p.discover.config_endpoint: is instead of dns: give one"},
		{"a config endpoint with srv", "pools:\n  p:\n    discover: {config_endpoint: \"c.test:11211\", srv: true}\n",
			"m.yaml:3: pools.p.discover.srv: not with config_endpoint: with dns only"},
		{"a config endpoint without a port", "pools:\n  p:\n    discover: {config_endpoint: c.test}\n",
			`m.yaml:3: pools.p.discover.config_endpoint: bad address "c.test": want the host:port of a configuration endpoint`},
		{"with servers", "pools:\n  p:\n    servers: [\"h:1\"]\n    discover: {dns: mc.test}\n",
			"m.yaml:4: pools.p.discover: is instead of servers and embedded: give one of the three"},
		{"bad resolver", "pools:\n  p:\n    discover: {dns: mc.test, resolver: nope}\n",
			`m.yaml:3: pools.p.discover.resolver: bad address "nope": want the host:port of a DNS server, or "" for the system's resolver`},
		{"bad port", "pools:\n  p:\n    discover: {dns: mc.test, port: 0}\n", "m.yaml:3: pools.p.discover.port: must be at least 1, got 0"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.src), "m.yaml")
			if err == nil {
				t.Fatalf("Parse = %+v, want error %q", c, tt.want)
			}
			if got := err.Error(); got != tt.want {
				t.Errorf("error:\n%s\nwant:\n%s", got, tt.want)
			}
		})
	}
}
