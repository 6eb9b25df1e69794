package admin

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/topology"
)

// routeTopology is pools main (three servers, failover, the second one dead) and spare
// (one server), main the default, spare the default of the listener at 127.0.0.1:22122.
func routeTopology(t *testing.T, namespaced bool) fixed {
	t.Helper()
	newPool := func(name string, opts pool.Options, ups ...bool) *pool.Pool {
		var ms []pool.Member
		for i, up := range ups {
			ms = append(ms, pool.Member{Name: fmt.Sprintf("%s%d", name, i), Addr: fmt.Sprintf("127.0.0.%d:11211", i+1), Weight: 1,
				Server: fakeServer{up: up}})
		}
		pl, err := pool.New(name, opts, ms)
		if err != nil {
			t.Fatal(err)
		}
		return pl
	}
	main := newPool("main", pool.Options{Failover: true}, true, false, true)
	spare := newPool("spare", pool.Options{}, true)
	topo := &topology.Topology{Pools: []*pool.Pool{main, spare}, Default: main, Namespaced: namespaced,
		Routes: []topology.Route{{Prefix: []byte("s:"), Pool: spare}}}
	topo.Listeners = map[string]*topology.Topology{"127.0.0.1:22122": {Pools: topo.Pools, Default: spare, Routes: topo.Routes, Namespaced: namespaced}}
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:11211"
	return fixed{t: topo, cfg: cfg}
}

// getRoute is GET /route?query from loopback, as /route answers only there without a token.
func getRoute(h http.Handler, query string) (int, string) {
	r := httptest.NewRequest("GET", "/route?"+query, nil)
	r.RemoteAddr = "127.0.0.1:1234"
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code, w.Body.String()
}

// TestRouteParameters: every malformed question is a 400 that says what is wrong, and the
// well-formed ones answer what the pool's own placement says.
func TestRouteParameters(t *testing.T) {
	long := strings.Repeat("k", 251)
	cases := []struct {
		name       string
		namespaced bool
		query      string
		code       int
		want       string // in the body
	}{
		{"no key", false, "", 400, "give one key"},
		{"an empty key", false, "key=", 400, "give one key"},
		{"two keys", false, "key=a&key=b", 400, "give one key"},
		{"a bad escape", false, "key=%zz", 400, "bad query"},
		{"an unknown listener", false, "key=a&listener=127.0.0.1:1", 400, `no listener "127.0.0.1:1": the listeners are 127.0.0.1:11211, 127.0.0.1:22122`},
		{"a key over 250 bytes", false, "key=" + long, 400, "longer than limits.max_key_bytes"},
		{"namespaces without a user", true, "key=a", 400, "auth.namespaces is on"},
		{"a user with a colon", true, "key=a&user=a:b", 400, "no colon"},
		{"a key over 250 bytes with its namespace", true, "key=" + long[:246] + "&user=alice", 400, "as stored"},
		{"a key", false, "key=a", 200, `"pool": "main"`},
		{"the main listener named", false, "key=a&listener=127.0.0.1:11211", 200, `"pool": "main"`},
		{"another listener", false, "key=a&listener=127.0.0.1:22122", 200, `"pool": "spare"`},
		{"a route on another listener", false, "key=s:a&listener=127.0.0.1:22122", 200, `"pool": "spare"`},
		{"a route", false, "key=s:a", 200, `"pool": "spare"`},
		{"a key of 250 bytes", false, "key=" + long[:250], 200, `"pool": "main"`},
		{"a user's key", true, "key=a&user=alice", 200, `"key": "a"`},
		{"a user's key of 244 bytes", true, "key=" + long[:244] + "&user=alice", 200, `"pool": "main"`},
		{"a key that is not UTF-8", false, "key=%FF%fe", 200, `"key": "%FF%fe",` + "\n" + `  "key_b64": "//4="`},
		{"a key with an escaped space", false, "key=a%20b", 200, `"key": "a b"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := routeTopology(t, c.namespaced)
			h := Handler(Sources{Registry: prometheus.NewRegistry(), Topologies: f, Migrations: f, Reloader: f})
			code, body := getRoute(h, c.query)
			if code != c.code || !strings.Contains(body, c.want) {
				t.Errorf("GET /route?%s = %d %q, want %d with %q", c.query, code, body, c.code, c.want)
			}
		})
	}
}

// TestRouteStandIn: over main's keys, /route names the member pool.Locate picks, and for
// each key of the dead member the stand-in and, as stand_in_for, the dead member.
func TestRouteStandIn(t *testing.T) {
	f := routeTopology(t, false)
	h := Handler(Sources{Registry: prometheus.NewRegistry(), Topologies: f, Migrations: f, Reloader: f})
	main := f.t.Default
	standIns := 0
	for i := range 300 {
		key := fmt.Sprintf("key:%d", i)
		code, body := getRoute(h, "key="+key)
		var got RouteJSON
		if err := json.Unmarshal([]byte(body), &got); code != http.StatusOK || err != nil {
			t.Fatalf("GET /route?key=%s = %d %q (%v)", key, code, body, err)
		}
		m, owner := main.Member(main.Locate([]byte(key))), main.Member(main.Owner([]byte(key)))
		want := RouteJSON{Key: key, Pool: "main", Server: m.Name, Addr: m.Addr, Replicas: []ServerJSON{}, Zones: []ServerJSON{}}
		if m != owner {
			want.StandInFor = owner.Name
			standIns++
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("GET /route?key=%s = %+v, want %+v", key, got, want)
		}
		if got.StandInFor != "" && got.StandInFor != "main1" {
			t.Errorf("%s: stand_in_for %q, but main1 is the dead one", key, got.StandInFor)
		}
	}
	if standIns == 0 {
		t.Error("no key of the dead member: the test tests nothing")
	}
	t.Logf("300 keys, %d of them on a stand-in for main1", standIns)
}
