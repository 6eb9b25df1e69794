package config

import (
	"bytes"
	"errors"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/moxi-proxy/moxi/internal/auth/limit"
	"github.com/moxi-proxy/moxi/internal/hashkit"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/replica"
)

// Upper bounds that catch typos before they become memory: each knob below allocates in
// proportion to its value.
const (
	maxPoolConnections = 1024    // connections per server
	maxEmbedded        = 1024    // embedded shards per pool
	maxRetries         = 100     // attempts multiply the worst-case latency
	maxValueBytes      = 1 << 30 // memcached's own largest item size (-I 1024m)
	maxHotKeysTop      = 1000    // keys reported per pool by hot_keys
)

// minHotKeysWindow is the shortest hot_keys.window: a shorter one counts too few
// requests, at a sample of a percent, to tell a hot key from noise.
const minHotKeysWindow = time.Second

// links holds the nodes of names that refer to pools, checked once every pool is known.
type links struct {
	pools       *yaml.Node            // value of `pools`, nil when absent
	poolsKey    *yaml.Node            // key `pools`, where "default_pool required" points
	defaultPool *yaml.Node            // value of `default_pool`
	backups     map[string]*yaml.Node // pool name -> its `backup` value
	warmFrom    map[string]*yaml.Node // pool name -> its `warm_from` value
	shadows     map[string]*yaml.Node // pool name -> its `shadow.pool` value
	routePools  []*yaml.Node          // value of each valid route's `pool`, as c.Routes
	readiness   []*yaml.Node          // each entry of `readiness.pools`, as c.Readiness.Pools
	listeners   []listenerNodes       // as c.Listeners
	twemproxy   bool                  // no pools, but twemproxy pools at the top level: nothing to link
}

// listenerNodes are the nodes of a listener's entry that link checks.
type listenerNodes struct {
	entry, defaultPool, tls *yaml.Node // defaultPool and tls nil when absent
}

// Parse reads a config file's contents, fills in every default and validates the result.
// filename is used only in error messages. On failure the error lists every problem found
// (up to a bound), one "file:line: field: message" per line, and the Config is nil.
func Parse(data []byte, filename string) (*Config, error) {
	d := &decoder{file: filename}
	c := d.parse(data)
	if err := d.err(); err != nil {
		return nil, err
	}
	return c, nil
}

// Read is Parse, then LoadTLS, LoadAdminToken, LoadPeerToken and LoadSecrets: what moxi does at every
// load, with the problems of the file and of the files it names in one error, sorted by
// line, so that one run of --check reports them all.
func Read(data []byte, filename string) (*Config, error) {
	d := &decoder{file: filename}
	c := d.parse(data)
	var applies []func()
	if c != nil {
		applies = c.readFiles(d)
	}
	if err := d.err(); err != nil {
		return nil, err
	}
	for _, apply := range applies {
		apply()
	}
	return c, nil
}

// parse reads data into a Config, reporting its problems to d; nil when data is no YAML
// document, else the Config as far as it could be read.
func (d *decoder) parse(data []byte) *Config {
	root, ok := d.document(data)
	if !ok {
		return nil
	}
	c := newConfig()
	l := &links{backups: map[string]*yaml.Node{}, warmFrom: map[string]*yaml.Node{}, shadows: map[string]*yaml.Node{}}
	if d.config(c, root, l) && !l.twemproxy {
		d.link(c, l)
	}
	return c
}

// yamlLine matches the position yaml.v3 puts in its syntax errors.
var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// document parses data as exactly one YAML document and returns its top node; an empty
// file gives an empty mapping so that its only complaint is the missing pools.
func (d *decoder) document(data []byte) (*yaml.Node, bool) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		d.syntax(err, data)
		return nil, false
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case err == nil:
		d.fail(&next, "", "only one YAML document is allowed")
		return nil, false
	case !errors.Is(err, io.EOF):
		d.syntax(err, data)
		return nil, false
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return &yaml.Node{Kind: yaml.MappingNode, Line: 1}, true
	}
	return deref(doc.Content[0]), true
}

// syntax reports a YAML syntax error at its line. A tab in the indentation up to that
// line is named as the cause: YAML indents with spaces only, and yaml.v3's own words
// for it ("found character that cannot start any token") do not say so.
func (d *decoder) syntax(err error, data []byte) {
	msg := err.Error()
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		// yaml.v3 may name the line before the tab's.
		if tab := tabLine(data); tab > 0 && tab <= line+1 {
			d.fail(&yaml.Node{Line: tab}, "", "indented with a tab: YAML indents with spaces only")
			return
		}
		if strings.HasPrefix(m[2], "did not find expected") {
			line = parserErrorLine(line, data)
		}
		d.fail(&yaml.Node{Line: line}, "", "%s", m[2])
		return
	}
	d.fail(nil, "", "%s", strings.TrimPrefix(msg, "yaml: "))
}

// parserErrorLine is the line of the file where the construct a yaml.v3 parser error
// names begins ("did not find expected key": the mapping; "… ',' or ']'": the list), from
// the line the error gives: yaml.v3 counts that one from 0 (its scanner errors from 1). A
// construct left open at the end of the file is reported on its last line that is not
// empty.
func parserErrorLine(reported int, data []byte) int {
	lines := strings.Split(strings.TrimRight(string(data), " \t\r\n"), "\n")
	return min(reported+1, len(lines))
}

// config reads the top-level mapping; false means it is not one, and there is nothing
// more to check.
func (d *decoder) config(c *Config, root *yaml.Node, l *links) bool {
	if isNull(root) {
		root = &yaml.Node{Kind: yaml.MappingNode, Line: root.Line}
	}
	if root.Kind != yaml.MappingNode {
		d.fail(root, "", "want a mapping, got %s", describe(root))
		return false
	}
	if msg := kubernetesObject(root); msg != "" {
		d.fail(root, "", "%s", msg)
		return false
	}
	twemproxy := false
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == "pools" {
			l.poolsKey = root.Content[i]
		}
		twemproxy = twemproxy || twemproxyPool(deref(root.Content[i+1]))
	}
	// A nutcracker.yml has pools but no pools key: its unknown keys say what to do, and
	// "at least one pool is required" would only add noise.
	l.twemproxy = twemproxy && l.poolsKey == nil
	seen := d.mapping(root, "", map[string]field{
		"listen":    d.listenAddr(&c.Listen, false, true),
		"tls":       func(v *yaml.Node, path string) { c.TLS = d.listenTLS(v, path) },
		"listeners": func(v *yaml.Node, path string) { c.Listeners = d.listeners(v, path, l) },
		"admin":     d.listenAddr(&c.Admin, true, false),
		"admin_token_file": func(v *yaml.Node, path string) {
			if d.str(&c.AdminTokenFile)(v, path); c.AdminTokenFile != "" {
				c.AdminTokenLine = v.Line
			}
		},
		"shutdown_timeout": d.duration(&c.ShutdownTimeout, false),
		"zone":             d.zoneName(&c.Zone, true),
		"limits": func(v *yaml.Node, path string) {
			d.mapping(v, path, map[string]field{
				"max_connections":   d.integer(&c.Limits.MaxConnections, 1, math.MaxInt),
				"max_key_bytes":     d.integer(&c.Limits.MaxKeyBytes, 1, protocol.MaxKeyLength),
				"max_value_bytes":   d.integer(&c.Limits.MaxValueBytes, 1, maxValueBytes),
				"max_multiget_keys": d.integer(&c.Limits.MaxMultigetKeys, 1, math.MaxInt),
				"allow_flush_all":   d.boolean(&c.Limits.AllowFlushAll),

				"max_buffered_bytes":   d.integer(&c.Limits.MaxBufferedBytes, 1, math.MaxInt),
				"max_connection_bytes": d.integer(&c.Limits.MaxConnectionBytes, 1, math.MaxInt),
				"max_background_bytes": d.integer(&c.Limits.MaxBackgroundBytes, 1, math.MaxInt),
				"request_timeout":      d.duration(&c.Limits.RequestTimeout, true),
				"write_timeout":        d.duration(&c.Limits.WriteTimeout, true),
			})
		},
		"watch_config": d.boolean(&c.WatchConfig),
		"apply_at":     d.instant(&c.ApplyAt),
		"pools":        func(v *yaml.Node, path string) { c.Pools = d.pools(v, path, l) },
		"default_pool": d.str(&c.DefaultPool),
		"routes":       d.routes(&c.Routes, l),
		"dedup":        d.boolean(&c.Dedup),
		"hot_cache":    func(v *yaml.Node, path string) { d.hotCache(&c.HotCache, v, path) },
		"hot_keys":     func(v *yaml.Node, path string) { d.hotKeys(&c.HotKeys, v, path) },
		"auth":         func(v *yaml.Node, path string) { c.Auth = d.auth(v, path) },
		"readiness": func(v *yaml.Node, path string) {
			seen := d.mapping(v, path, map[string]field{"pools": d.strings(&c.Readiness.Pools)})
			if n := seen["pools"]; n != nil && n.Kind == yaml.SequenceNode && len(n.Content) == len(c.Readiness.Pools) {
				for _, e := range n.Content {
					l.readiness = append(l.readiness, deref(e))
				}
			}
		},
		"metrics": func(v *yaml.Node, path string) {
			d.mapping(v, path, map[string]field{
				"per_server":      d.boolean(&c.Metrics.PerServer),
				"latency_buckets": d.buckets(&c.Metrics.LatencyBuckets),
			})
		},
		"fire_and_forget": func(v *yaml.Node, path string) {
			d.mapping(v, path, map[string]field{
				"prefixes":          d.strings(&c.FireAndForget.Prefixes),
				"max_pending":       d.integer(&c.FireAndForget.MaxPending, 1, math.MaxInt),
				"max_pending_bytes": d.integer(&c.FireAndForget.MaxPendingBytes, 1, math.MaxInt),
			})
		},
	})
	l.pools = seen["pools"]
	if v := seen["default_pool"]; v != nil && !isNull(v) {
		l.defaultPool = v
	}
	return true
}

// listenAddr reads an address to listen on; offOK lets "" mean "do not listen", and pathOK
// lets a path (see UnixSocket) name a Unix socket.
func (d *decoder) listenAddr(dst *string, offOK, pathOK bool) field {
	return func(v *yaml.Node, path string) {
		if !d.scalar(v, path) {
			return
		}
		if v.Value == "" && offOK {
			*dst = ""
			return
		}
		if pathOK && UnixSocket(v.Value) {
			if msg := badSocketPath(v.Value); msg != "" {
				d.fail(v, path, "%s", msg)
				return
			}
			*dst = v.Value
			return
		}
		a, ok := canonAddr(v.Value, true)
		if !ok {
			also := ""
			if offOK {
				also = `, or "" for off`
			}
			if pathOK {
				also = ", or the path of a Unix socket (/run/moxi/moxi.sock)"
			}
			d.fail(v, path, "bad address %q: want host:port with a port from 0 to 65535%s", v.Value, also)
			return
		}
		*dst = a
	}
}

// listenTLS reads the top-level tls section.
func (d *decoder) listenTLS(v *yaml.Node, path string) *TLS {
	t, seen := d.tlsFields(v, path)
	if t == nil {
		return nil
	}
	d.requireCert(t, v, path, seen)
	return t
}

// tlsFields reads the fields of a tls section of a listen address; nil when v is not a
// mapping.
func (d *decoder) tlsFields(v *yaml.Node, path string) (*TLS, map[string]*yaml.Node) {
	t := &TLS{Line: v.Line}
	seen := d.mapping(v, path, map[string]field{
		"cert":      d.str(&t.Cert),
		"key":       d.str(&t.Key),
		"client_ca": d.str(&t.ClientCA),
	})
	if v.Kind != yaml.MappingNode {
		return nil, seen
	}
	return t, seen
}

// requireCert reports a tls section at v without its certificate or key.
func (d *decoder) requireCert(t *TLS, v *yaml.Node, path string, seen map[string]*yaml.Node) {
	for _, f := range []struct {
		key, val, what string
	}{{"cert", t.Cert, "the certificate chain moxi presents"}, {"key", t.Key, "the certificate's private key"}} {
		d.require(v, path, seen, f.key, f.val, "the PEM file of "+f.what)
	}
}

// require reports the section at v without a value for key (what says what it is), unless
// the value given was bad, which is reported already.
func (d *decoder) require(v *yaml.Node, path string, seen map[string]*yaml.Node, key, value, what string) {
	if value == "" && !d.bad[seen[key]] {
		d.fail(v, join(path, key), "required: %s", what)
	}
}

// listeners reads the listeners list; the default pools and the tls sections, which
// depend on the rest of the file, are completed by link.
func (d *decoder) listeners(v *yaml.Node, path string, l *links) []Listener {
	var out []Listener
	d.entriesOf(v, path, "a list of {listen, default_pool, tls}", "empty listener: want {listen, default_pool, tls}", func(e *yaml.Node, at string) {
		ln := Listener{Line: e.Line}
		var tlsNode *yaml.Node
		n := len(d.errs) + d.dropped
		seen := d.mapping(e, at, map[string]field{
			"listen":       d.listenAddr(&ln.Listen, false, true),
			"default_pool": d.str(&ln.DefaultPool),
			"tls": func(v *yaml.Node, path string) {
				ln.TLS, _ = d.tlsFields(v, path)
				tlsNode = v
			},
		})
		if len(d.errs)+d.dropped != n || e.Kind != yaml.MappingNode {
			return
		}
		if ln.Listen == "" {
			d.fail(e, join(at, "listen"), "required: the address or Unix socket path of this port")
			return
		}
		nodes := listenerNodes{entry: e, tls: tlsNode}
		if dp := seen["default_pool"]; dp != nil && !isNull(dp) {
			nodes.defaultPool = dp
		}
		out = append(out, ln)
		l.listeners = append(l.listeners, nodes)
	})
	return out
}

// entriesOf calls each for every entry of the list v, with its path; v that is no list is
// reported as not being want, and an empty entry with empty.
func (d *decoder) entriesOf(v *yaml.Node, path, want, empty string, each func(e *yaml.Node, at string)) {
	if v.Kind != yaml.SequenceNode {
		d.fail(v, path, "want %s, got %s", want, describe(v))
		return
	}
	for i, e := range v.Content {
		e = deref(e)
		at := index(path, i)
		if isNull(e) {
			d.fail(e, at, "%s", empty)
			continue
		}
		each(e, at)
	}
}

// poolTLS reads a pool's tls section; an empty one means TLS verified by the system's roots.
func (d *decoder) poolTLS(v *yaml.Node, path string) *PoolTLS {
	t := &PoolTLS{Line: v.Line}
	seen := d.mapping(v, path, map[string]field{
		"ca":          d.str(&t.CA),
		"cert":        d.str(&t.Cert),
		"key":         d.str(&t.Key),
		"server_name": d.str(&t.ServerName),
	})
	if v.Kind != yaml.MappingNode {
		return nil
	}
	switch {
	case t.Cert != "" && t.Key == "":
		d.fail(seen["cert"], join(path, "key"), "required with cert: the PEM file of the client certificate's private key")
	case t.Key != "" && t.Cert == "":
		d.fail(seen["key"], join(path, "cert"), "required with key: the PEM file of the client certificate")
	}
	return t
}

// pools reads the pools mapping, keeping file order.
func (d *decoder) pools(v *yaml.Node, path string, l *links) []*Pool {
	var out []*Pool
	d.entries(v, path, func(name string, k, pv *yaml.Node) {
		at := join(path, name)
		if name == "" {
			d.fail(k, at, "a pool needs a name")
			return
		}
		p := NewPool(name)
		seen := d.pool(p, k, pv, at)
		for key, m := range map[string]map[string]*yaml.Node{"backup": l.backups, "warm_from": l.warmFrom} {
			if n := seen[key]; n != nil && !isNull(n) && !d.bad[n] && (key != "warm_from" || p.WarmFrom != "") {
				m[name] = n
			}
		}
		if n := seen["shadow"]; p.Shadow != nil && n != nil {
			l.shadows[name] = n
		}
		out = append(out, p)
	})
	return out
}

// pool reads one pool's settings into p and returns the nodes of the keys it had.
func (d *decoder) pool(p *Pool, key, v *yaml.Node, path string) map[string]*yaml.Node {
	// The names come from the packages that implement them, so that every name accepted
	// here builds and every one they build is accepted.
	seen := d.mapping(v, path, map[string]field{
		"distribution":       d.oneOf(&p.Distribution, "distribution", pool.Distributions()),
		"hash":               d.oneOf(&p.Hash, "hash", hashkit.Names()),
		"hash_tag":           d.hashTag(&p.HashTag),
		"servers":            d.servers(&p.Servers),
		"connections":        d.integer(&p.Connections, 1, maxPoolConnections),
		"connect_timeout":    d.duration(&p.ConnectTimeout, true),
		"timeout":            d.duration(&p.Timeout, true),
		"retries":            d.integer(&p.Retries, 0, maxRetries),
		"failure_limit":      d.integer(&p.FailureLimit, 1, math.MaxInt),
		"dead_backoff":       d.duration(&p.DeadBackoff, true),
		"dead_backoff_max":   d.duration(&p.DeadBackoffMax, true),
		"failover":           d.boolean(&p.Failover),
		"failover_ttl":       d.duration(&p.FailoverTTL, true),
		"backup":             d.str(&p.Backup),
		"embedded":           d.integer(&p.Embedded, 0, maxEmbedded),
		"embedded_memory_mb": d.integer(&p.EmbeddedMemoryMB, 1, math.MaxInt),
		"migrate_rate":       d.integer(&p.MigrateRate, 0, math.MaxInt),
		"replicas":           d.integer(&p.Replicas, 1, pool.MaxReplicas),
		"write_quorum":       d.oneOf(&p.WriteQuorum, "write_quorum", replica.WriteQuorums()),
		"read_from":          d.oneOf(&p.ReadFrom, "read_from", replica.ReadFroms()),
		"tls":                func(v *yaml.Node, path string) { p.TLS = d.poolTLS(v, path) },
		"sasl":               func(v *yaml.Node, path string) { p.SASL = d.sasl(v, path) },
		"warm_from":          d.str(&p.WarmFrom),
		"shadow":             func(v *yaml.Node, path string) { p.Shadow = d.shadow(v, path) },
		"discover":           func(v *yaml.Node, path string) { p.Discover = d.discover(v, path, serversDiscover) },
		"zones":              func(v *yaml.Node, path string) { d.zones(p, v, path) },
	})
	if p.DeadBackoffMax < p.DeadBackoff {
		at, n := "dead_backoff_max", seen["dead_backoff_max"]
		if n == nil {
			at, n = "dead_backoff", seen["dead_backoff"]
		}
		d.fail(n, join(path, at), "dead_backoff_max (%s) must not be less than dead_backoff (%s)",
			p.DeadBackoffMax, p.DeadBackoff)
	}
	// servers: [] counts as none; a list whose entries all failed has already been reported.
	sv := seen["servers"]
	hasServers := sv != nil && !isNull(sv) && (sv.Kind != yaml.SequenceNode || len(sv.Content) > 0)
	zv := seen["zones"]
	switch {
	case d.bad[seen["embedded"]] || d.bad[seen["discover"]] || d.bad[zv]:
		// Already reported; whether the pool has shards or discovers its servers is unknown.
	case zv != nil && (hasServers || p.Embedded > 0 || p.Discover != nil):
		d.fail(zv, join(path, "zones"), "is instead of servers, embedded and discover: each zone lists its own servers")
	case zv != nil && p.Replicas > 1:
		d.fail(seen["replicas"], join(path, "replicas"), "not with zones: a pool with zones keeps one copy of each key in each zone")
	case zv != nil:
		// The zones' servers are the pool's: checked by zones.
	case hasServers && p.Embedded > 0:
		d.fail(seen["embedded"], path, "has both servers and embedded; give one")
	case p.Discover != nil && (hasServers || p.Embedded > 0):
		d.fail(seen["discover"], join(path, "discover"), "is instead of servers and embedded: give one of the three")
	case !hasServers && p.Embedded == 0 && p.Discover == nil:
		d.fail(key, path, "has no servers: give servers, embedded or discover")
	case p.Embedded > 0 && p.TLS != nil:
		d.fail(seen["tls"], join(path, "tls"), "an embedded pool has no servers to reach over TLS")
	case p.Embedded > 0 && p.SASL != nil:
		d.fail(seen["sasl"], join(path, "sasl"), "an embedded pool has no servers to authenticate to")
	case p.Replicas > 1 && hasServers && sv.Kind == yaml.SequenceNode && len(sv.Content) < p.Replicas:
		d.fail(seen["replicas"], join(path, "replicas"), "is %d but the pool has %d servers", p.Replicas, len(sv.Content))
	case p.Embedded > 0 && p.Replicas > p.Embedded:
		d.fail(seen["replicas"], join(path, "replicas"), "is %d but the pool has %d embedded shards", p.Replicas, p.Embedded)
	}
	if p.SASL != nil {
		// Servers that require SASL speak only the binary protocol, and a warm-up, a
		// migration's listing and copy, and a shadow's meta requests need the text one.
		const why = "not with sasl: servers that require SASL speak only the binary protocol, which %s needs the text protocol beside"
		for key, what := range map[string]string{"warm_from": "a warm-up", "shadow": "a shadow"} {
			if n := seen[key]; n != nil && !isNull(n) {
				d.fail(n, join(path, key), why, what)
			}
		}
		for i, sv := range p.Servers {
			if sv.MigrateFrom != "" {
				d.fail(&yaml.Node{Line: sv.Line}, join(path, index("servers", i)+".migrate_from"), why, "a migration")
			}
		}
	}
	return seen
}

// auth reads the auth section; users_file is required.
func (d *decoder) auth(v *yaml.Node, path string) *Auth {
	a := &Auth{Line: v.Line}
	seen := d.mapping(v, path, map[string]field{
		"users_file": d.str(&a.UsersFile),
		"limits":     func(v *yaml.Node, path string) { a.Limits = d.userLimits(v, path) },
		"namespaces": d.boolean(&a.Namespaces),
	})
	if v.Kind != yaml.MappingNode {
		return nil
	}
	d.require(v, path, seen, "users_file", a.UsersFile, `the file of "user:password" lines clients authenticate with`)
	return a
}

// userLimits reads auth.limits: user name (or limit.Every) → its rates.
func (d *decoder) userLimits(v *yaml.Node, path string) []UserLimit {
	var out []UserLimit
	d.entries(v, path, func(name string, k, uv *yaml.Node) {
		at := join(path, name)
		if name == "" || strings.ContainsAny(name, ": \t") {
			d.fail(k, at, "not a user name: a users file's names have no colon or space (%q for every user without an entry)", limit.Every)
			return
		}
		u := UserLimit{User: name}
		d.mapping(uv, at, map[string]field{
			"requests_per_s": d.integer(&u.RequestsPerS, 0, math.MaxInt),
			"bytes_per_s":    d.integer(&u.BytesPerS, 0, math.MaxInt),
		})
		out = append(out, u)
	})
	return out
}

// sasl reads a pool's sasl section; user and password_file are required.
func (d *decoder) sasl(v *yaml.Node, path string) *SASL {
	s := &SASL{Line: v.Line}
	seen := d.mapping(v, path, map[string]field{
		"user":          d.str(&s.User),
		"password_file": d.str(&s.PasswordFile),
	})
	if v.Kind != yaml.MappingNode {
		return nil
	}
	d.require(v, path, seen, "user", s.User, "the SASL user moxi authenticates to the servers as")
	d.require(v, path, seen, "password_file", s.PasswordFile, "the file holding the SASL user's password")
	return s
}

// discoverKind is what a discover section finds: a pool's servers, or a hot cache's peers.
type discoverKind struct {
	port     int    // the default port of A/AAAA answers
	what     string // what the name's records are, for "dns: required"
	endpoint bool   // config_endpoint may be given instead of dns
}

var (
	serversDiscover = discoverKind{defaultDiscoverPort, "this pool's servers (or config_endpoint)", true}
	peersDiscover   = discoverKind{defaultPeersPort, "this tier's other moxi, at their admin port", false}
)

// discover reads a discover section of kind; dns is required.
func (d *decoder) discover(v *yaml.Node, path string, kind discoverKind) *Discover {
	disc := &Discover{Port: kind.port, Interval: defaultDiscoverInterval, RemoveAfter: defaultRemoveAfter}
	n := len(d.errs) + d.dropped
	seen := d.mapping(v, path, map[string]field{
		"dns": d.str(&disc.DNS),
		"config_endpoint": func(v *yaml.Node, path string) {
			if !d.scalar(v, path) || v.Value == "" {
				return
			}
			a, ok := canonAddr(v.Value, false)
			if !ok {
				d.fail(v, path, "bad address %q: want the host:port of a configuration endpoint", v.Value)
				return
			}
			disc.ConfigEndpoint = a
		},
		"port":         d.integer(&disc.Port, 1, 65535),
		"srv":          d.boolean(&disc.SRV),
		"interval":     d.duration(&disc.Interval, true),
		"remove_after": d.duration(&disc.RemoveAfter, false),
		"resolver": func(v *yaml.Node, path string) {
			if !d.scalar(v, path) || v.Value == "" {
				return
			}
			a, ok := canonAddr(v.Value, false)
			if !ok {
				d.fail(v, path, "bad address %q: want the host:port of a DNS server, or \"\" for the system's resolver", v.Value)
				return
			}
			disc.Resolver = a
		},
	})
	if v.Kind != yaml.MappingNode || len(d.errs)+d.dropped != n {
		d.bad[v] = true
		return nil
	}
	switch {
	case !kind.endpoint && seen["config_endpoint"] != nil && !isNull(seen["config_endpoint"]):
		// A configuration endpoint lists memcached nodes, never moxi.
		d.fail(seen["config_endpoint"], join(path, "config_endpoint"), "not here: a configuration endpoint lists memcached nodes; give dns")
	case disc.DNS != "" && disc.ConfigEndpoint != "":
		d.fail(seen["config_endpoint"], join(path, "config_endpoint"), "is instead of dns: give one")
	case disc.ConfigEndpoint != "":
		// The endpoint's answer is the cluster: its nodes' ports, no DNS server, and a node
		// it no longer lists is gone at once.
		for _, key := range []string{"port", "srv", "resolver", "remove_after"} {
			if n := seen[key]; n != nil {
				d.fail(n, join(path, key), "not with config_endpoint: with dns only")
			}
		}
		disc.RemoveAfter = 0
	case disc.DNS == "":
		at := seen["dns"]
		if at == nil {
			at = v
		}
		d.fail(at, join(path, "dns"), "required: the name whose records are %s", kind.what)
	}
	if len(d.errs)+d.dropped != n {
		d.bad[v] = true
		return nil
	}
	return disc
}

// hotCache reads the hot_cache section: the LRU's bounds, and the peers it keeps in step
// with, which need the token they present to each other.
func (d *decoder) hotCache(h *HotCache, v *yaml.Node, path string) {
	seen := d.mapping(v, path, map[string]field{
		"prefixes":  d.strings(&h.Prefixes),
		"max_items": d.integer(&h.MaxItems, 1, math.MaxInt),
		"max_bytes": d.integer(&h.MaxBytes, 1, math.MaxInt),
		"ttl":       d.duration(&h.TTL, true),
		"peers":     d.peers(&h.Peers),
		"peers_discover": func(v *yaml.Node, path string) {
			if v.Kind == yaml.MappingNode && len(v.Content) == 0 {
				return // {}, the reference example's: no discovery
			}
			h.PeersDiscover = d.discover(v, path, peersDiscover)
		},
		"peer_token_file": func(v *yaml.Node, path string) {
			if d.str(&h.PeerTokenFile)(v, path); h.PeerTokenFile != "" {
				h.PeerTokenLine = v.Line
			}
		},
	})
	if len(h.Peers) > 0 && h.PeersDiscover != nil {
		d.fail(seen["peers_discover"], join(path, "peers_discover"), "is instead of peers: give one")
	}
	if h.PeerTokenFile == "" && !d.bad[seen["peer_token_file"]] {
		const what = ": the file holding the token this tier's moxi present to each other's POST /invalidate"
		switch {
		case len(h.Peers) > 0:
			d.fail(seen["peers"], join(path, "peer_token_file"), "required with peers"+what)
		case h.PeersDiscover != nil:
			d.fail(seen["peers_discover"], join(path, "peer_token_file"), "required with peers_discover"+what)
		}
	}
}

// peers reads hot_cache.peers: the admin addresses (host:port) of the other moxi of the
// tier, each once; an empty list leaves dst nil.
func (d *decoder) peers(dst *[]string) field {
	return list(d, dst, "a list of admin addresses (host:port)", func(e *yaml.Node, at string, before []string) (string, bool) {
		a, ok := canonAddr(e.Value, false)
		switch {
		case !ok:
			d.fail(e, at, "%s: another moxi's admin address", badAddr(e.Value))
		case slices.Contains(before, a):
			d.fail(e, at, "peer %s listed twice", a)
		default:
			return a, true
		}
		return "", false
	})
}

// hotKeys reads the hot_keys section; present, even empty, it turns the count on.
func (d *decoder) hotKeys(h *HotKeys, v *yaml.Node, path string) {
	d.mapping(v, path, map[string]field{
		"top":    d.integer(&h.Top, 1, maxHotKeysTop),
		"sample": d.share(&h.Sample, true, "the share of requests counted"),
		"window": func(v *yaml.Node, path string) {
			w := h.Window
			if d.duration(&w, true)(v, path); w != h.Window && w < minHotKeysWindow {
				d.fail(v, path, "must be at least %s, got %s", minHotKeysWindow, v.Value)
				return
			}
			h.Window = w
		},
		"min_share": d.share(&h.MinShare, false, "a hot key's share of its pool's requests"),
		"cache":     d.boolean(&h.Cache),
	})
	h.Enabled = v.Kind == yaml.MappingNode
}

// share reads a number more than 0 and less than 1, or with oneOK at most 1; what says
// what it is a share of, for messages.
func (d *decoder) share(dst *float64, oneOK bool, what string) field {
	return func(v *yaml.Node, path string) {
		if !d.scalar(v, path) {
			return
		}
		bound := "less than 1"
		if oneOK {
			bound = "at most 1"
		}
		var f float64
		if t := v.ShortTag(); (t != "!!float" && t != "!!int") || v.Decode(&f) != nil {
			d.fail(v, path, "want a number more than 0 and %s, got %q", bound, v.Value)
			return
		}
		if !(f > 0 && (f < 1 || oneOK && f == 1)) {
			d.fail(v, path, "must be more than 0 and %s (%s), got %s", bound, what, v.Value)
			return
		}
		*dst = f
	}
}

// hashTag reads a pool's hash_tag: none, or two characters as twemproxy takes them.
func (d *decoder) hashTag(dst *string) field {
	return func(v *yaml.Node, path string) {
		if !d.scalar(v, path) {
			return
		}
		if len(v.Value) != 0 && len(v.Value) != 2 {
			d.fail(v, path, `want two characters, the opening and closing ones of the part of a key that is hashed (e.g. "{}"), or "" for the whole key; got %q`, v.Value)
			return
		}
		*dst = v.Value
	}
}

// shadow reads a pool's shadow section; pool is required, fraction lies in [0, 1].
func (d *decoder) shadow(v *yaml.Node, path string) *Shadow {
	s := &Shadow{}
	n := len(d.errs) + d.dropped
	seen := d.mapping(v, path, map[string]field{
		"pool": d.str(&s.Pool),
		"fraction": func(v *yaml.Node, path string) {
			if !d.scalar(v, path) {
				return
			}
			var f float64
			if t := v.ShortTag(); (t != "!!float" && t != "!!int") || v.Decode(&f) != nil {
				d.fail(v, path, "want a number from 0 to 1, got %q", v.Value)
				return
			}
			if !(f >= 0 && f <= 1) {
				d.fail(v, path, "must be from 0 to 1 (the share of keys shadowed), got %s", v.Value)
				return
			}
			s.Fraction = f
		},
	})
	if v.Kind != yaml.MappingNode || len(d.errs)+d.dropped != n {
		return nil
	}
	if pn := seen["pool"]; pn == nil || isNull(pn) || s.Pool == "" {
		if s.Fraction > 0 {
			d.fail(v, join(path, "pool"), "required with a fraction: the pool that shadow requests go to")
		}
		return nil // pool "" (the reference example's): no shadow
	}
	return s
}

// routes reads the route list; a prefix that an earlier prefix already covers is an
// error because that route could never match.
func (d *decoder) routes(dst *[]Route, l *links) field {
	return func(v *yaml.Node, path string) {
		var lines []int
		d.entriesOf(v, path, "a list", "empty route", func(e *yaml.Node, at string) {
			var r Route
			n := len(d.errs) + d.dropped
			seen := d.mapping(e, at, map[string]field{"prefix": d.str(&r.Prefix), "pool": d.str(&r.Pool)})
			if len(d.errs)+d.dropped != n || e.Kind != yaml.MappingNode {
				return
			}
			pn, ok := seen["pool"]
			if !ok || isNull(pn) {
				d.fail(e, join(at, "pool"), "required")
				return
			}
			pre := seen["prefix"]
			if pre == nil || isNull(pre) || r.Prefix == "" {
				if pre == nil {
					pre = e
				}
				d.fail(pre, join(at, "prefix"), "required and must not be empty; unrouted keys go to default_pool")
				return
			}
			shadowed := false
			for j, earlier := range *dst {
				if strings.HasPrefix(r.Prefix, earlier.Prefix) {
					d.fail(pre, join(at, "prefix"), "never matches: the route at line %d (prefix %q) matches first",
						lines[j], earlier.Prefix)
					shadowed = true
					break
				}
			}
			if shadowed {
				return
			}
			*dst = append(*dst, r)
			lines = append(lines, e.Line)
			l.routePools = append(l.routePools, pn)
		})
	}
}
