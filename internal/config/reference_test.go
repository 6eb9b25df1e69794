package config

import (
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/moxi-proxy/moxi/internal/auth/limit"
)

// TestReferencePageKeys keeps docs/configuration.md, the configuration reference, in step
// with the parser both ways: every key of a config with every key set is documented there
// by its path in backquotes (pools as `pools.*.timeout`, list entries as
// `listeners[].listen`), and every such path the page names is a key Parse accepts.
func TestReferencePageKeys(t *testing.T) {
	data, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	page := string(data)

	keys := keyPaths(t, everyKeyConfig())
	// hot_cache.peers and hot_cache.peers_discover are one or the other: the second's keys
	// come from a config of their own.
	discovered := everyKeyConfig()
	discovered.HotCache.Peers = nil
	discovered.HotCache.PeersDiscover = &Discover{DNS: "moxi-admin.cache.svc.cluster.local", Port: 9151, SRV: true,
		Interval: 10 * time.Second, RemoveAfter: time.Minute, Resolver: "10.96.0.10:53"}
	for _, k := range keyPaths(t, discovered) {
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		if !strings.Contains(page, "`"+k+"`") {
			t.Errorf("docs/configuration.md does not document `%s`", k)
		}
	}

	if unknownKeyAt("limits.no_such_key") == "" {
		t.Fatal("the probe of a key takes limits.no_such_key for a key")
	}
	// The paths to check are those under a top-level key, e.g. `limits.max_connections`.
	var alt []string
	for _, k := range keys {
		if top, _, _ := strings.Cut(strings.ReplaceAll(k, "[]", "."), "."); !slices.Contains(alt, top) {
			alt = append(alt, top)
		}
	}
	named := regexp.MustCompile("`((?:" + strings.Join(alt, "|") + `)(?:\.(?:[a-z_]+|\*)|\[\])+)` + "`")
	checked := map[string]bool{}
	for _, m := range named.FindAllStringSubmatch(page, -1) {
		path := m[1]
		if checked[path] {
			continue
		}
		checked[path] = true
		if msg := unknownKeyAt(path); msg != "" {
			t.Errorf("docs/configuration.md names `%s`, which is not a config key: %s", path, msg)
		}
	}
	if len(checked) < len(keys)/2 {
		t.Errorf("docs/configuration.md names %d dotted keys, want most of the %d", len(checked), len(keys))
	}
}

// everyKeyConfig is contractConfig with the optional keys it leaves unset set too, so that
// its YAML (which leaves an unset optional key out) writes every key there is.
func everyKeyConfig() *Config {
	c := contractConfig()
	c.AdminTokenFile = "/etc/moxi/admin-token"
	c.ApplyAt = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	c.TLS.ClientCA = "/etc/moxi/client-ca.crt"
	c.Listeners[0].TLS.ClientCA = "/etc/moxi/client-ca.crt"
	p, other := c.Pools[0], c.Pools[1].Name
	p.HashTag = "{}"
	p.TLS.Cert, p.TLS.Key, p.TLS.ServerName = "/etc/moxi/client.crt", "/etc/moxi/client.key", "cache.internal"
	p.WarmFrom = other
	p.Shadow = &Shadow{Pool: other, Fraction: 0.01}
	c.Auth = &Auth{UsersFile: "/etc/moxi/users", Namespaces: true, Limits: []UserLimit{{User: limit.Every, RequestsPerS: 50000}}}
	c.Pools[1].SASL = &SASL{User: "moxi", PasswordFile: "/etc/moxi/sasl-password"}
	c.Zone = "us-east-1b"
	c.HotCache.Peers = []string{"10.0.0.2:9151", "10.0.0.3:9151"}
	c.HotCache.PeerTokenFile = "/etc/moxi/peer-token"
	c.HotKeys.Enabled, c.HotKeys.Cache = true, true
	c.Pools = append(c.Pools, &Pool{Name: "zoned", Distribution: p.Distribution, Hash: p.Hash, Zones: []string{"us-east-1a", "us-east-1b"},
		Servers:      []Server{{Addr: "10.0.1.5:11211", Weight: 1, Zone: "us-east-1a"}},
		ZoneDiscover: map[string]*Discover{"us-east-1b": {ConfigEndpoint: "cluster-b.cfg.cache.amazonaws.com:11211", Interval: 10 * time.Second}}})
	c.Pools[1].Discover = &Discover{DNS: "_memcache._tcp.memcached.cache.svc.cluster.local", Port: 11211, SRV: true,
		Interval: 10 * time.Second, RemoveAfter: time.Minute, Resolver: "10.96.0.10:53"}
	return c
}

// keyPaths is every key of c's YAML by its path, in file order: a pool's name is "*", an
// entry of a list of mappings is "[]" ("pools.*.servers[].addr"), and a key whose value is
// a mapping or a list is a path of its own as well as its keys ("pools.*.tls").
func keyPaths(t *testing.T, c *Config) []string {
	t.Helper()
	b, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	var out []string
	seen := map[string]bool{}
	var walk func(path string, n *yaml.Node)
	walk = func(path string, n *yaml.Node) {
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := n.Content[i].Value
				if path == "pools" {
					k = "*"
				}
				p := join(path, k)
				if !seen[p] {
					seen[p] = true
					out = append(out, p)
				}
				walk(p, n.Content[i+1])
			}
		case yaml.SequenceNode:
			for _, e := range n.Content {
				walk(path+"[]", e)
			}
		}
	}
	walk("", doc.Content[0])
	return out
}

// unknownKeyAt says why Parse does not accept the key at path, or "" when it does: it
// parses a file that gives the key, and nothing else on its way, an empty value, and looks
// for an "unknown key" among the errors (a file this bare has others, such as a pool with
// no servers, which do not matter here).
func unknownKeyAt(path string) string {
	var node func(segs []string) *yaml.Node
	node = func(segs []string) *yaml.Node {
		if len(segs) == 0 {
			return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}
		}
		seg := segs[0]
		key, list := strings.CutSuffix(seg, "[]")
		if key == "*" {
			key = "p"
		}
		v := node(segs[1:])
		if list {
			v = &yaml.Node{Kind: yaml.SequenceNode, Content: []*yaml.Node{v}}
		}
		return &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{strNode(key), v}}
	}
	b, err := yaml.Marshal(node(strings.Split(path, ".")))
	if err != nil {
		return err.Error()
	}
	_, err = Parse(b, "probe.yaml")
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else if err != nil {
		errs = []error{err}
	}
	for _, e := range errs {
		var ce *Error
		if errors.As(e, &ce) && strings.HasPrefix(ce.Msg, "unknown key") {
			return ce.Error()
		}
	}
	return ""
}
