package config

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// restartNote marks a setting that a reload reads but cannot apply: the listeners, the
// limits the connections were accepted with, and the fire-and-forget queue are made once,
// at startup.
const restartNote = " (takes effect at the next restart)"

// Diff names each difference between prev and next, one line each, in the file's key
// order and with the file's key names, for the reload's log line and POST /reload's
// answer:
//
//	pool main: servers added: 127.0.0.1:11214
//	pool main: server 127.0.0.1:11213: weight 1 → 2
//	pool main: timeout 250ms → 300ms
//	routes: "sess:" → sessions added
//	listen 127.0.0.1:11211 → 127.0.0.1:11311 (takes effect at the next restart)
//
// Servers are matched by RingName, so a new address under the same name is a change of
// that server and a new address without a name is a server removed and one added, as the
// ring sees them. Durations are written as time.Duration does, names and prefixes that
// could be empty are quoted, and Server.Line is ignored. Diff returns nil when nothing
// differs. prev and next must not be nil.
//
// Diff compares the restart-only settings with prev as well, which is right only while
// prev holds what the process runs with; after an earlier reload use DiffSince.
func Diff(prev, next *Config) []string { return DiffSince(prev, prev, next) }

// DiffSince is Diff for a process that started with started and has reloaded since: the
// restart-only settings (listen, admin, limits.* but allow_flush_all,
// fire_and_forget.max_pending) are compared with started, whose values the process still
// runs with, so that one changed at an earlier reload is reported until a restart applies
// it, and one changed back is not reported at all. Every other setting is compared with
// prev, the config in service.
func DiffSince(started, prev, next *Config) []string {
	var d differ
	restart := func(key string, a, b any) { d.change("", key, a, b, restartNote) }
	live := func(key string, a, b any) { d.change("", key, a, b, "") }
	restart("listen", quoteEmpty(started.Listen), quoteEmpty(next.Listen))
	d.listenTLS(started, prev, next)
	d.listeners(started, prev, next)
	restart("admin", quoteEmpty(started.Admin), quoteEmpty(next.Admin))
	live("admin_token_file", quoteEmpty(prev.AdminTokenFile), quoteEmpty(next.AdminTokenFile))
	if prev.AdminTokenFile == next.AdminTokenFile && !bytes.Equal(prev.AdminToken, next.AdminToken) {
		d.add("admin_token_file: token changed") // never the token itself: the line is logged
	}
	live("shutdown_timeout", prev.ShutdownTimeout, next.ShutdownTimeout)
	restart("limits.max_connections", started.Limits.MaxConnections, next.Limits.MaxConnections)
	restart("limits.max_key_bytes", started.Limits.MaxKeyBytes, next.Limits.MaxKeyBytes)
	restart("limits.max_value_bytes", started.Limits.MaxValueBytes, next.Limits.MaxValueBytes)
	restart("limits.max_multiget_keys", started.Limits.MaxMultigetKeys, next.Limits.MaxMultigetKeys)
	live("limits.allow_flush_all", prev.Limits.AllowFlushAll, next.Limits.AllowFlushAll)
	restart("limits.max_buffered_bytes", started.Limits.MaxBufferedBytes, next.Limits.MaxBufferedBytes)
	restart("limits.max_connection_bytes", started.Limits.MaxConnectionBytes, next.Limits.MaxConnectionBytes)
	restart("limits.max_background_bytes", started.Limits.MaxBackgroundBytes, next.Limits.MaxBackgroundBytes)
	restart("limits.request_timeout", started.Limits.RequestTimeout, next.Limits.RequestTimeout)
	restart("limits.write_timeout", started.Limits.WriteTimeout, next.Limits.WriteTimeout)
	live("watch_config", prev.WatchConfig, next.WatchConfig)
	live("apply_at", timeOrEmpty(prev.ApplyAt), timeOrEmpty(next.ApplyAt))
	d.pools(prev, next)
	live("default_pool", prev.DefaultPool, next.DefaultPool)
	d.routes(prev.Routes, next.Routes)
	live("dedup", prev.Dedup, next.Dedup)
	live("hot_cache.prefixes", quoteList(prev.HotCache.Prefixes), quoteList(next.HotCache.Prefixes))
	live("hot_cache.max_items", prev.HotCache.MaxItems, next.HotCache.MaxItems)
	live("hot_cache.max_bytes", prev.HotCache.MaxBytes, next.HotCache.MaxBytes)
	live("hot_cache.ttl", prev.HotCache.TTL, next.HotCache.TTL)
	d.peers(prev.HotCache, next.HotCache)
	d.hotKeys(prev.HotKeys, next.HotKeys)
	live("fire_and_forget.prefixes", quoteList(prev.FireAndForget.Prefixes), quoteList(next.FireAndForget.Prefixes))
	restart("fire_and_forget.max_pending", started.FireAndForget.MaxPending, next.FireAndForget.MaxPending)
	restart("fire_and_forget.max_pending_bytes", started.FireAndForget.MaxPendingBytes, next.FireAndForget.MaxPendingBytes)
	d.auth(prev.Auth, next.Auth)
	live("readiness.pools", quoteList(prev.Readiness.Pools), quoteList(next.Readiness.Pools))
	restart("metrics.per_server", started.Metrics.PerServer, next.Metrics.PerServer)
	restart("metrics.latency_buckets", fmt.Sprint(started.Metrics.LatencyBuckets), fmt.Sprint(next.Metrics.LatencyBuckets))
	return d.lines
}

// peers reports hot_cache's peers, every change live: the list (when not discovered), the
// discover section, and the token; never the token itself, since the lines are logged.
func (d *differ) peers(a, b HotCache) {
	listed := func(h HotCache) string {
		if h.PeersDiscover != nil {
			return quoteList(nil) // the discovered peers are the answers', not the file's
		}
		return quoteList(h.Peers)
	}
	d.change("", "hot_cache.peers", listed(a), listed(b), "")
	d.change("", "hot_cache.peers_discover", discoverLine(a.PeersDiscover), discoverLine(b.PeersDiscover), "")
	d.change("", "hot_cache.peer_token_file", quoteEmpty(a.PeerTokenFile), quoteEmpty(b.PeerTokenFile), "")
	if a.PeerTokenFile == b.PeerTokenFile && !bytes.Equal(a.PeerToken, b.PeerToken) {
		d.add("hot_cache.peer_token_file: token changed")
	}
}

// hotKeys reports the hot_keys section, every change live: turned on or off, and while it
// is on, its settings (turned on, those that differ from the previous, default, ones).
func (d *differ) hotKeys(a, b HotKeys) {
	d.change("", "hot_keys", onOff(a.Enabled), onOff(b.Enabled), "")
	if !b.Enabled {
		return
	}
	d.change("", "hot_keys.top", a.Top, b.Top, "")
	d.change("", "hot_keys.sample", a.Sample, b.Sample, "")
	d.change("", "hot_keys.window", a.Window, b.Window, "")
	d.change("", "hot_keys.min_share", a.MinShare, b.MinShare, "")
	d.change("", "hot_keys.cache", a.Cache, b.Cache, "")
}

// auth reports the auth section's changes; never a password, since the lines are logged.
func (d *differ) auth(a, b *Auth) {
	switch {
	case a == nil && b == nil:
		return
	case a == nil:
		d.add("auth: added")
		return
	case b == nil:
		d.add("auth: removed")
		return
	}
	d.change("", "auth.users_file", quoteEmpty(a.UsersFile), quoteEmpty(b.UsersFile), "")
	d.change("", "auth.namespaces", a.Namespaces, b.Namespaces, "")
	if a.UsersFile == b.UsersFile && !maps.Equal(a.Users, b.Users) {
		d.add("auth.users_file: users changed")
	}
	d.userLimits(a.Limits, b.Limits)
}

// userLimits reports auth.limits' entries added and changed in b's order, then those
// removed in a's.
func (d *differ) userLimits(a, b []UserLimit) {
	find := func(l []UserLimit, user string) *UserLimit {
		for i := range l {
			if l[i].User == user {
				return &l[i]
			}
		}
		return nil
	}
	for _, nu := range b {
		key := "auth.limits." + nu.User
		pu := find(a, nu.User)
		if pu == nil {
			d.add("%s: added (requests_per_s %d, bytes_per_s %d)", key, nu.RequestsPerS, nu.BytesPerS)
			continue
		}
		d.change("", key+".requests_per_s", pu.RequestsPerS, nu.RequestsPerS, "")
		d.change("", key+".bytes_per_s", pu.BytesPerS, nu.BytesPerS, "")
	}
	for _, pu := range a {
		if find(b, pu.User) == nil {
			d.add("auth.limits.%s: removed", pu.User)
		}
	}
}

// differ collects the lines of a Diff.
type differ struct {
	lines []string
}

func (d *differ) add(format string, args ...any) {
	d.lines = append(d.lines, fmt.Sprintf(format, args...))
}

// change adds "<prefix><key> a → b<note>" when a and b differ. They are values of one
// comparable type (a string, number, bool or duration), already in the form the line
// shows: strings that may be empty or lists pass through quoteEmpty or quoteList first.
func (d *differ) change(prefix, key string, a, b any, note string) {
	if a != b {
		d.add("%s%s %v → %v%s", prefix, key, a, b, note)
	}
}

// zonesLabel is a pool's zones in listed order, "none" without.
func zonesLabel(zones []string) string {
	if len(zones) == 0 {
		return "none"
	}
	return "[" + strings.Join(zones, ", ") + "]"
}

// pools reports pools added and changed in next's order, then those removed in prev's.
func (d *differ) pools(prev, next *Config) {
	for _, np := range next.Pools {
		pp := prev.Pool(np.Name)
		if pp == nil {
			d.add("pool %s: added", np.Name)
			continue
		}
		d.pool("pool "+np.Name+": ", pp, np)
	}
	for _, pp := range prev.Pools {
		if next.Pool(pp.Name) == nil {
			d.add("pool %s: removed", pp.Name)
		}
	}
}

func (d *differ) pool(prefix string, a, b *Pool) {
	d.change(prefix, "distribution", a.Distribution, b.Distribution, "")
	d.change(prefix, "hash", a.Hash, b.Hash, "")
	d.change(prefix, "hash_tag", quoteEmpty(a.HashTag), quoteEmpty(b.HashTag), "")
	d.change(prefix, "discover", discoverLine(a.Discover), discoverLine(b.Discover), restartNote)
	d.change(prefix, "zones", zonesLabel(a.Zones), zonesLabel(b.Zones), "")
	for _, z := range b.Zones {
		d.change(prefix, "zones."+z+".discover", discoverLine(a.ZoneDiscover[z]), discoverLine(b.ZoneDiscover[z]), restartNote)
	}
	d.servers(prefix, a.Servers, b.Servers)
	d.change(prefix, "connections", a.Connections, b.Connections, "")
	d.change(prefix, "connect_timeout", a.ConnectTimeout, b.ConnectTimeout, "")
	d.change(prefix, "timeout", a.Timeout, b.Timeout, "")
	d.change(prefix, "retries", a.Retries, b.Retries, "")
	d.change(prefix, "failure_limit", a.FailureLimit, b.FailureLimit, "")
	d.change(prefix, "dead_backoff", a.DeadBackoff, b.DeadBackoff, "")
	d.change(prefix, "dead_backoff_max", a.DeadBackoffMax, b.DeadBackoffMax, "")
	d.change(prefix, "failover", a.Failover, b.Failover, "")
	d.change(prefix, "failover_ttl", a.FailoverTTL, b.FailoverTTL, "")
	d.change(prefix, "backup", quoteEmpty(a.Backup), quoteEmpty(b.Backup), "")
	d.change(prefix, "embedded", a.Embedded, b.Embedded, "")
	d.change(prefix, "embedded_memory_mb", a.EmbeddedMemoryMB, b.EmbeddedMemoryMB, "")
	d.change(prefix, "migrate_rate", a.MigrateRate, b.MigrateRate, "")
	d.change(prefix, "replicas", a.Replicas, b.Replicas, "")
	d.change(prefix, "write_quorum", a.WriteQuorum, b.WriteQuorum, "")
	d.change(prefix, "read_from", a.ReadFrom, b.ReadFrom, "")
	d.change(prefix, "warm_from", quoteEmpty(a.WarmFrom), quoteEmpty(b.WarmFrom), "")
	d.change(prefix, "shadow", shadowLabel(a.Shadow), shadowLabel(b.Shadow), "")
	switch at, bt := a.TLS, b.TLS; {
	case at == nil || bt == nil:
		d.change(prefix, "tls", onOff(at != nil), onOff(bt != nil), "")
	default:
		d.change(prefix, "tls.ca", quoteEmpty(at.CA), quoteEmpty(bt.CA), "")
		d.change(prefix, "tls.cert", quoteEmpty(at.Cert), quoteEmpty(bt.Cert), "")
		d.change(prefix, "tls.key", quoteEmpty(at.Key), quoteEmpty(bt.Key), "")
		d.change(prefix, "tls.server_name", quoteEmpty(at.ServerName), quoteEmpty(bt.ServerName), "")
		if at.Sum != bt.Sum && at.CA == bt.CA && at.Cert == bt.Cert && at.Key == bt.Key && at.ServerName == bt.ServerName {
			d.add("%stls: files changed (its servers reconnect with them)", prefix)
		}
	}
	switch as, bs := a.SASL, b.SASL; {
	case as == nil || bs == nil:
		d.change(prefix, "sasl", onOff(as != nil), onOff(bs != nil), "")
	default:
		d.change(prefix, "sasl.user", quoteEmpty(as.User), quoteEmpty(bs.User), "")
		d.change(prefix, "sasl.password_file", quoteEmpty(as.PasswordFile), quoteEmpty(bs.PasswordFile), "")
		if as.PasswordFile == bs.PasswordFile && !bytes.Equal(as.Password, bs.Password) {
			d.add("%ssasl.password_file: password changed (its servers reconnect with it)", prefix) // never the password: the line is logged
		}
	}
}

// shadowLabel shows a shadow section in a line: "sandbox fraction 0.1", or off.
func shadowLabel(s *Shadow) string {
	if s == nil {
		return "off"
	}
	return s.Pool + " fraction " + strconv.FormatFloat(s.Fraction, 'g', -1, 64)
}

// listenTLS reports the tls section. Turning TLS on or off needs a restart (the listener
// is made once); the files, and client_ca, change at a reload: the connections accepted
// from then on use them, and those accepted before keep theirs.
func (d *differ) listenTLS(started, prev, next *Config) {
	if (started.TLS != nil) != (next.TLS != nil) {
		d.change("", "tls", onOff(started.TLS != nil), onOff(next.TLS != nil), restartNote)
		return
	}
	a, b := prev.TLS, next.TLS
	if a == nil || b == nil {
		// Off at the start and now; or on at both and off in between (that reload said a
		// restart was needed), which kept serving started's certificate: compare with it.
		a, b = started.TLS, next.TLS
		if a == nil {
			return
		}
	}
	d.change("", "tls.cert", a.Cert, b.Cert, "")
	d.change("", "tls.key", a.Key, b.Key, "")
	d.change("", "tls.client_ca", quoteEmpty(a.ClientCA), quoteEmpty(b.ClientCA), "")
	if a.Sum != b.Sum && a.Cert == b.Cert && a.Key == b.Key && a.ClientCA == b.ClientCA {
		d.add("tls: files changed (new connections use them)")
	}
}

// listeners reports the listeners: their addresses and TLS need a restart (the sockets are
// opened at startup), and their default pools change at the reload. Listeners are matched
// by address.
func (d *differ) listeners(started, prev, next *Config) {
	addrs := func(c *Config) string {
		var out []string
		for _, l := range c.Listeners {
			out = append(out, l.Listen)
		}
		return quoteList(out)
	}
	d.change("", "listeners", addrs(started), addrs(next), restartNote)
	for _, b := range next.Listeners {
		for _, a := range prev.Listeners {
			if a.Listen != b.Listen {
				continue
			}
			at := "listeners " + b.Listen + ": "
			d.change(at, "default_pool", a.DefaultPool, b.DefaultPool, "")
			d.change(at, "tls", onOff(a.TLS != nil), onOff(b.TLS != nil), restartNote)
			if a.TLS != nil && b.TLS != nil && (a.TLS.Cert != b.TLS.Cert || a.TLS.Key != b.TLS.Key ||
				a.TLS.ClientCA != b.TLS.ClientCA || a.TLS.Sum != b.TLS.Sum) {
				d.add("%stls: files changed (new connections use them)", at)
			}
		}
	}
}

// discoverLine is a discover section in one line, "off" when there is none.
func discoverLine(dc *Discover) string {
	if dc == nil {
		return "off"
	}
	if dc.ConfigEndpoint != "" {
		return fmt.Sprintf("config endpoint %s every %s", dc.ConfigEndpoint, dc.Interval)
	}
	kind := "A/AAAA"
	if dc.SRV {
		kind = "SRV"
	}
	return fmt.Sprintf("%s %s port %d every %s remove_after %s resolver %s", kind, dc.DNS, dc.Port, dc.Interval, dc.RemoveAfter, quoteEmpty(dc.Resolver))
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// servers reports the servers added and removed, the changes of each server kept, and a
// change of order among the kept ones (jump places keys by server order).
func (d *differ) servers(prefix string, prev, next []Server) {
	byName := func(ss []Server) map[string]Server {
		m := make(map[string]Server, len(ss))
		for _, s := range ss {
			m[s.MemberName()] = s
		}
		return m
	}
	was, is := byName(prev), byName(next)
	var added, removed, keptBefore, keptAfter []string
	for _, s := range prev {
		if _, ok := is[s.MemberName()]; !ok {
			removed = append(removed, serverLabel(s))
		} else {
			keptBefore = append(keptBefore, s.MemberName())
		}
	}
	for _, s := range next {
		if _, ok := was[s.MemberName()]; !ok {
			added = append(added, serverLabel(s))
		} else {
			keptAfter = append(keptAfter, s.MemberName())
		}
	}
	if len(added) > 0 {
		d.add("%sservers added: %s", prefix, strings.Join(added, ", "))
	}
	if len(removed) > 0 {
		d.add("%sservers removed: %s", prefix, strings.Join(removed, ", "))
	}
	for _, s := range next {
		p, ok := was[s.MemberName()]
		if !ok {
			continue
		}
		at := prefix + "server " + serverLabel(s) + ": "
		d.change(at, "name", quoteEmpty(p.Name), quoteEmpty(s.Name), "")
		d.change(at, "addr", p.Addr, s.Addr, "")
		d.change(at, "weight", p.Weight, s.Weight, "")
		d.change(at, "migrate_from", quoteEmpty(p.MigrateFrom), quoteEmpty(s.MigrateFrom), "")
		d.change(at, "migrate_at", timeOrEmpty(p.MigrateAt), timeOrEmpty(s.MigrateAt), "")
	}
	if !slices.Equal(keptBefore, keptAfter) {
		var order []string
		for _, name := range keptAfter {
			order = append(order, serverLabel(is[name]))
		}
		d.add("%sservers reordered: %s", prefix, strings.Join(order, ", "))
	}
}

// serverLabel names a server in a line: its address, and its name when it has one.
func serverLabel(s Server) string {
	if s.Name == "" {
		return s.Addr
	}
	return s.Name + " (" + s.Addr + ")"
}

// routes reports routes by prefix. Their order needs no line: Parse rejects a route that
// an earlier one shadows, so the set of prefixes decides which route a key takes.
func (d *differ) routes(prev, next []Route) {
	find := func(rs []Route, prefix string) (Route, bool) {
		i := slices.IndexFunc(rs, func(r Route) bool { return r.Prefix == prefix })
		if i < 0 {
			return Route{}, false
		}
		return rs[i], true
	}
	for _, r := range next {
		old, ok := find(prev, r.Prefix)
		switch {
		case !ok:
			d.add("routes: %q → %s added", r.Prefix, r.Pool)
		case old.Pool != r.Pool:
			d.add("routes: %q: pool %s → %s", r.Prefix, old.Pool, r.Pool)
		}
	}
	for _, r := range prev {
		if _, ok := find(next, r.Prefix); !ok {
			d.add("routes: %q → %s removed", r.Prefix, r.Pool)
		}
	}
}

// quoteEmpty shows "" for an empty setting, which would otherwise vanish from the line.
func quoteEmpty(s string) string {
	if s == "" {
		return `""`
	}
	return s
}

// quoteList shows a prefix list as the file's flow style writes it: ["a:", "b:"].
func quoteList(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// timeOrEmpty is t as the file gives it, or "" when unset.
func timeOrEmpty(t time.Time) string {
	if t.IsZero() {
		return `""`
	}
	return t.Format(time.RFC3339Nano)
}
