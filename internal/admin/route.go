package admin

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/topology"
)

// RouteJSON is GET /route's answer: where a key goes now, as the request path places it.
type RouteJSON struct {
	Key    string     `json:"key"`               // as given: the URL's escaped form when the key is not UTF-8
	KeyB64 string     `json:"key_b64,omitempty"` // the key, when it is not UTF-8
	Pool   string     `json:"pool"`
	Server string     `json:"server"`
	Addr   string     `json:"addr"`
	State  pool.State `json:"state"` // as GET /servers shows it
	// Replicas are, in a pool with replicas, the other members that hold the key, in ring
	// order (the order writes take and reads try them in); empty otherwise.
	Replicas []ServerJSON `json:"replicas"`
	// Zones are, in a pool with zones, the key's member in each zone, in listed order;
	// empty otherwise.
	Zones      []ServerJSON `json:"zones"`
	MovingFrom string       `json:"moving_from"`  // the old server's address while the key moves to Server
	HotCached  bool         `json:"hot_cached"`   // the hot cache would answer the key now
	StandInFor string       `json:"stand_in_for"` // the dead server Server stands in for, by name
}

// ServerJSON is one member that holds a key, in RouteJSON.
type ServerJSON struct {
	Zone   string     `json:"zone,omitempty"`
	Server string     `json:"server"`
	Addr   string     `json:"addr"`
	State  pool.State `json:"state"`
}

// routeHandler is GET /route?key=K[&listener=ADDR][&user=U].
func routeHandler(src Sources) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ans, err := routeQuery(src.Topologies.Topology(), src.Reloader.Config(), r.URL.RawQuery)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		writeJSON(w, ans)
	}
}

// routeQuery answers the query of GET /route on t, the main listener's table in service,
// run with cfg; an error is the client's (400).
func routeQuery(t *topology.Topology, cfg *config.Config, rawQuery string) (RouteJSON, error) {
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return RouteJSON{}, fmt.Errorf("bad query: %v", err)
	}
	if len(q["key"]) != 1 || q.Get("key") == "" {
		return RouteJSON{}, fmt.Errorf("give one key: /route?key=K (URL-escaped; &listener=ADDR for another listener's clients, &user=U with auth.namespaces)")
	}
	key := q.Get("key")
	if l := q.Get("listener"); l != "" && l != cfg.Listen {
		if t.Listeners[l] == nil {
			known := []string{cfg.Listen}
			for addr := range t.Listeners {
				known = append(known, addr)
			}
			slices.Sort(known[1:])
			return RouteJSON{}, fmt.Errorf("no listener %q: the listeners are %s", l, strings.Join(known, ", "))
		}
		t = t.ForListener(l)
	}
	if len(key) > cfg.Limits.MaxKeyBytes {
		return RouteJSON{}, fmt.Errorf("key of %d bytes: longer than limits.max_key_bytes (%d), which clients cannot send", len(key), cfg.Limits.MaxKeyBytes)
	}
	stored := key
	if t.Namespaced {
		user := q.Get("user")
		switch {
		case user == "":
			return RouteJSON{}, fmt.Errorf("auth.namespaces is on: each user's keys are stored as <user>:<key>, so where a key goes depends on whose it is; give the user: &user=U")
		case strings.Contains(user, ":"):
			return RouteJSON{}, fmt.Errorf("user %q: user names have no colon", user)
		}
		stored = user + ":" + key
	}
	if len(stored) > protocol.MaxKeyLength {
		return RouteJSON{}, fmt.Errorf("key of %d bytes as stored, its namespace included: longer than memcached's %d", len(stored), protocol.MaxKeyLength)
	}
	ans := Route(t, []byte(stored))
	ans.Key = key
	if !utf8.ValidString(key) {
		ans.Key, ans.KeyB64 = rawValue(rawQuery, "key"), base64.StdEncoding.EncodeToString([]byte(key))
	}
	return ans, nil
}

// rawValue is the first value of name in a URL query as written, still escaped.
func rawValue(rawQuery, name string) string {
	for part := range strings.SplitSeq(rawQuery, "&") {
		k, v, _ := strings.Cut(part, "=")
		if n, err := url.QueryUnescape(k); err == nil && n == name {
			return v
		}
	}
	return ""
}

// Route is where stored, a key as the servers store it (its namespace included), goes on
// t, a table as its listener's clients see it. It asks what the request path acts on: the
// pool (Topology.PoolFor), the member that serves the key and the one that owns it
// (pool.Pool.Placement, Locate's), the key's copies (pool.Pool.ReplicaSetOf), the member's
// stack for a key that moves (Topology.MovingFrom) and the hot cache (Topology.HotKey,
// hotcache.Cache.Holds). Key is left for the caller.
func Route(t *topology.Topology, stored []byte) RouteJSON {
	pl := t.PoolFor(stored)
	i, owner := pl.Placement(stored)
	m := pl.Member(i)
	ans := RouteJSON{
		Pool: pl.Name(), Server: m.Name, Addr: m.Addr, State: m.Server.Info().State,
		Replicas: []ServerJSON{}, Zones: []ServerJSON{},
		MovingFrom: t.MovingFrom(pl, i, stored),
		HotCached:  t.HotKey(pl, stored) && t.Hot.Holds(pl.Name(), stored),
	}
	zones := pl.Zones()
	switch {
	case len(zones) > 0:
		set := pl.ReplicaSetOf(stored)
		for _, j := range set.Idx[:set.N] {
			z := serverJSON(pl.Member(j))
			z.Zone = zones[pl.ZoneOf(j)]
			ans.Zones = append(ans.Zones, z)
		}
	case pl.Replicas() > 1:
		set := pl.ReplicaSetOf(stored)
		for _, j := range set.Idx[:set.N] {
			if j != i {
				ans.Replicas = append(ans.Replicas, serverJSON(pl.Member(j)))
			}
		}
	case owner != i:
		ans.StandInFor = pl.Member(owner).Name // with failover, i stands in for the owner
	}
	return ans
}

func serverJSON(m *pool.Member) ServerJSON {
	return ServerJSON{Server: m.Name, Addr: m.Addr, State: m.Server.Info().State}
}
