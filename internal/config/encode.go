package config

import (
	"bytes"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// YAML renders the effective config, every default written out, in the file's key order.
// Parse of the result gives back c (Server.Line aside, which records positions). It is
// what `moxi --check` prints and GET /config serves.
func (c *Config) YAML() ([]byte, error) {
	root := mapNode()
	put(root, "listen", strNode(c.Listen))
	if t := c.TLS; t != nil {
		put(root, "tls", tlsNode(t))
	}
	if len(c.Listeners) > 0 {
		list := &yaml.Node{Kind: yaml.SequenceNode}
		for _, l := range c.Listeners {
			m := mapNode()
			put(m, "listen", strNode(l.Listen))
			put(m, "default_pool", strNode(l.DefaultPool))
			if l.TLS != nil {
				put(m, "tls", tlsNode(l.TLS))
			}
			list.Content = append(list.Content, m)
		}
		put(root, "listeners", list)
	}
	put(root, "admin", strNode(c.Admin))
	if c.AdminTokenFile != "" {
		put(root, "admin_token_file", strNode(c.AdminTokenFile))
	}
	put(root, "shutdown_timeout", durNode(c.ShutdownTimeout))
	if c.Zone != "" {
		put(root, "zone", strNode(c.Zone))
	}
	limits := mapNode()
	put(limits, "max_connections", intNode(c.Limits.MaxConnections))
	put(limits, "max_key_bytes", intNode(c.Limits.MaxKeyBytes))
	put(limits, "max_value_bytes", intNode(c.Limits.MaxValueBytes))
	put(limits, "max_multiget_keys", intNode(c.Limits.MaxMultigetKeys))
	put(limits, "allow_flush_all", boolNode(c.Limits.AllowFlushAll))
	put(limits, "max_buffered_bytes", intNode(c.Limits.MaxBufferedBytes))
	put(limits, "max_connection_bytes", intNode(c.Limits.MaxConnectionBytes))
	put(limits, "max_background_bytes", intNode(c.Limits.MaxBackgroundBytes))
	put(limits, "request_timeout", durNode(c.Limits.RequestTimeout))
	put(limits, "write_timeout", durNode(c.Limits.WriteTimeout))
	put(root, "limits", limits)
	put(root, "watch_config", boolNode(c.WatchConfig))
	if !c.ApplyAt.IsZero() {
		put(root, "apply_at", strNode(c.ApplyAt.Format(time.RFC3339Nano)))
	}

	pools := mapNode()
	for _, p := range c.Pools {
		put(pools, p.Name, poolNode(p))
	}
	put(root, "pools", pools)
	put(root, "default_pool", strNode(c.DefaultPool))
	if len(c.Routes) > 0 {
		routes := &yaml.Node{Kind: yaml.SequenceNode}
		for _, r := range c.Routes {
			m := mapNode()
			put(m, "prefix", strNode(r.Prefix))
			put(m, "pool", strNode(r.Pool))
			routes.Content = append(routes.Content, m)
		}
		put(root, "routes", routes)
	}
	put(root, "dedup", boolNode(c.Dedup))

	hot := mapNode()
	put(hot, "prefixes", listNode(c.HotCache.Prefixes))
	put(hot, "max_items", intNode(c.HotCache.MaxItems))
	put(hot, "max_bytes", intNode(c.HotCache.MaxBytes))
	put(hot, "ttl", durNode(c.HotCache.TTL))
	switch h := c.HotCache; {
	case h.PeersDiscover != nil:
		put(hot, "peers_discover", discoverNode(h.PeersDiscover))
		if len(h.Peers) > 0 { // as moxi filled them in from the answers
			hot.Content[len(hot.Content)-2].LineComment = "discovered: " + strings.Join(h.Peers, ", ")
		}
	case len(h.Peers) > 0:
		put(hot, "peers", listNode(h.Peers))
	}
	if c.HotCache.PeerTokenFile != "" {
		put(hot, "peer_token_file", strNode(c.HotCache.PeerTokenFile)) // the file's name, never the token
	}
	put(root, "hot_cache", hot)
	if k := c.HotKeys; k.Enabled {
		hk := mapNode()
		put(hk, "top", intNode(k.Top))
		put(hk, "sample", floatNode(k.Sample))
		put(hk, "window", durNode(k.Window))
		put(hk, "min_share", floatNode(k.MinShare))
		put(hk, "cache", boolNode(k.Cache))
		put(root, "hot_keys", hk)
	}
	faf := mapNode()
	put(faf, "prefixes", listNode(c.FireAndForget.Prefixes))
	put(faf, "max_pending", intNode(c.FireAndForget.MaxPending))
	put(faf, "max_pending_bytes", intNode(c.FireAndForget.MaxPendingBytes))
	put(root, "fire_and_forget", faf)
	if a := c.Auth; a != nil {
		am := mapNode()
		put(am, "users_file", strNode(a.UsersFile)) // the file's name, never a password
		if len(a.Limits) > 0 {
			lm := mapNode()
			for _, u := range a.Limits {
				um := mapNode()
				put(um, "requests_per_s", intNode(u.RequestsPerS))
				put(um, "bytes_per_s", intNode(u.BytesPerS))
				put(lm, u.User, um)
			}
			put(am, "limits", lm)
		}
		put(am, "namespaces", boolNode(a.Namespaces))
		put(root, "auth", am)
	}

	readiness := mapNode()
	put(readiness, "pools", listNode(c.Readiness.Pools))
	put(root, "readiness", readiness)
	metrics := mapNode()
	put(metrics, "per_server", boolNode(c.Metrics.PerServer))
	buckets := &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
	for _, b := range c.Metrics.LatencyBuckets {
		buckets.Content = append(buckets.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!float", Value: strconv.FormatFloat(b, 'g', -1, 64)})
	}
	put(metrics, "latency_buckets", buckets)
	put(root, "metrics", metrics)

	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(root); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// tlsNode writes a tls section of a listen address.
func tlsNode(t *TLS) *yaml.Node {
	m := mapNode()
	put(m, "cert", strNode(t.Cert))
	put(m, "key", strNode(t.Key))
	if t.ClientCA != "" {
		put(m, "client_ca", strNode(t.ClientCA))
	}
	return m
}

func poolNode(p *Pool) *yaml.Node {
	m := mapNode()
	put(m, "distribution", strNode(p.Distribution))
	put(m, "hash", strNode(p.Hash))
	if p.HashTag != "" {
		put(m, "hash_tag", strNode(p.HashTag))
	}
	switch {
	case len(p.Zones) > 0:
		zones := &yaml.Node{Kind: yaml.SequenceNode}
		for _, z := range p.Zones {
			zm, servers := mapNode(), &yaml.Node{Kind: yaml.SequenceNode}
			for _, s := range p.Servers {
				if s.Zone == z {
					servers.Content = append(servers.Content, serverNode(s))
				}
			}
			put(zm, "name", strNode(z))
			if dc := p.ZoneDiscover[z]; dc != nil {
				var found []Server
				for _, s := range p.Servers {
					if s.Zone == z {
						found = append(found, s)
					}
				}
				putDiscover(zm, dc, found)
			} else {
				put(zm, "servers", servers)
			}
			zones.Content = append(zones.Content, zm)
		}
		put(m, "zones", zones)
	case len(p.Servers) > 0 && p.Discover == nil:
		servers := &yaml.Node{Kind: yaml.SequenceNode}
		for _, s := range p.Servers {
			servers.Content = append(servers.Content, serverNode(s))
		}
		put(m, "servers", servers)
	}
	put(m, "connections", intNode(p.Connections))
	put(m, "connect_timeout", durNode(p.ConnectTimeout))
	put(m, "timeout", durNode(p.Timeout))
	put(m, "retries", intNode(p.Retries))
	put(m, "failure_limit", intNode(p.FailureLimit))
	put(m, "dead_backoff", durNode(p.DeadBackoff))
	put(m, "dead_backoff_max", durNode(p.DeadBackoffMax))
	put(m, "failover", boolNode(p.Failover))
	put(m, "failover_ttl", durNode(p.FailoverTTL))
	if p.Backup != "" {
		put(m, "backup", strNode(p.Backup))
	}
	put(m, "embedded", intNode(p.Embedded))
	put(m, "embedded_memory_mb", intNode(p.EmbeddedMemoryMB))
	put(m, "migrate_rate", intNode(p.MigrateRate))
	put(m, "replicas", intNode(p.Replicas))
	put(m, "write_quorum", strNode(p.WriteQuorum))
	put(m, "read_from", strNode(p.ReadFrom))
	if t := p.TLS; t != nil {
		tm := mapNode()
		for _, f := range [][2]string{{"ca", t.CA}, {"cert", t.Cert}, {"key", t.Key}, {"server_name", t.ServerName}} {
			if f[1] != "" {
				put(tm, f[0], strNode(f[1]))
			}
		}
		put(m, "tls", tm)
	}
	if sc := p.SASL; sc != nil {
		sm := mapNode()
		put(sm, "user", strNode(sc.User))
		put(sm, "password_file", strNode(sc.PasswordFile)) // the file's name, never the password
		put(m, "sasl", sm)
	}
	if p.WarmFrom != "" {
		put(m, "warm_from", strNode(p.WarmFrom))
	}
	if p.Discover != nil {
		putDiscover(m, p.Discover, p.Servers)
	}
	if sh := p.Shadow; sh != nil {
		sm := mapNode()
		put(sm, "pool", strNode(sh.Pool))
		put(sm, "fraction", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!float", Value: strconv.FormatFloat(sh.Fraction, 'g', -1, 64)})
		put(m, "shadow", sm)
	}
	return m
}

// serverNode writes the short "host:port[:weight]" form when it says everything, so the
// printed topology stays as readable as a hand-written one.
func serverNode(s Server) *yaml.Node {
	if s.Name == "" && s.MigrateFrom == "" {
		if s.Weight == 1 {
			return strNode(s.Addr)
		}
		return strNode(s.Addr + ":" + strconv.Itoa(s.Weight))
	}
	m := mapNode()
	if s.Name != "" {
		put(m, "name", strNode(s.Name))
	}
	put(m, "addr", strNode(s.Addr))
	put(m, "weight", intNode(s.Weight))
	if s.MigrateFrom != "" {
		put(m, "migrate_from", strNode(s.MigrateFrom))
	}
	if !s.MigrateAt.IsZero() {
		put(m, "migrate_at", strNode(s.MigrateAt.Format(time.RFC3339Nano)))
	}
	return m
}

func mapNode() *yaml.Node { return &yaml.Node{Kind: yaml.MappingNode} }

func put(m *yaml.Node, key string, v *yaml.Node) {
	m.Content = append(m.Content, strNode(key), v)
}

// strNode is a string scalar; the encoder quotes it when it would otherwise read back as
// another type (e.g. "true" or "").
func strNode(s string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s} }

func intNode(i int) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(i)}
}

func boolNode(b bool) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(b)}
}

func durNode(d time.Duration) *yaml.Node { return strNode(d.String()) }

// floatNode is a number written as briefly as it reads back exactly.
func floatNode(f float64) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!float", Value: strconv.FormatFloat(f, 'g', -1, 64)}
}

// listNode is a flow-style list, ["a", "b"], as prefixes are written in the example.
func listNode(ss []string) *yaml.Node {
	n := &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
	for _, s := range ss {
		n.Content = append(n.Content, strNode(s))
	}
	return n
}

// putDiscover puts a discover section in m, with what it found (servers) in a comment: for
// --check and GET /config, since a file gives discover instead of servers.
func putDiscover(m *yaml.Node, dc *Discover, servers []Server) {
	put(m, "discover", discoverNode(dc))
	var found []string
	for _, s := range servers {
		found = append(found, serverNode(s).Value)
		if s.Name != "" {
			found[len(found)-1] = s.Addr + ":" + strconv.Itoa(s.Weight) + " " + s.Name
		}
	}
	if len(found) == 0 {
		m.Content[len(m.Content)-2].LineComment = "discovered: nothing yet"
	} else {
		m.Content[len(m.Content)-2].LineComment = "discovered: " + strings.Join(found, ", ")
	}
}

// discoverNode writes a discover section.
func discoverNode(dc *Discover) *yaml.Node {
	dm := mapNode()
	if dc.ConfigEndpoint != "" {
		put(dm, "config_endpoint", strNode(dc.ConfigEndpoint))
		put(dm, "interval", durNode(dc.Interval))
	} else {
		put(dm, "dns", strNode(dc.DNS))
		put(dm, "port", intNode(dc.Port))
		put(dm, "srv", boolNode(dc.SRV))
		put(dm, "interval", durNode(dc.Interval))
		put(dm, "remove_after", durNode(dc.RemoveAfter))
		if dc.Resolver != "" {
			put(dm, "resolver", strNode(dc.Resolver))
		}
	}
	return dm
}
