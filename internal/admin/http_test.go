package admin

import (
	"bufio"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/migrate"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/topology"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeServer is a pool server that is only up or down: readiness asks nothing else.
type fakeServer struct {
	pool.Server
	up bool
}

func (f fakeServer) Up() bool { return f.up }

func (f fakeServer) Info() pool.Info { return pool.Info{} }

// fixed is a topology, a reloader and a migration list that never change.
type fixed struct {
	t   *topology.Topology
	cfg *config.Config
}

func (f fixed) Topology() *topology.Topology  { return f.t }
func (f fixed) Migrations() []migrate.Status  { return nil }
func (f fixed) Config() *config.Config        { return f.cfg }
func (f fixed) Reload(string) (string, error) { return "no changes\n", nil }
func (f fixed) with(cfg *config.Config) fixed { f.cfg = cfg; return f }
func (f fixed) handler(draining func() bool) http.Handler {
	return Handler(Sources{Registry: prometheus.NewRegistry(), Topologies: f, Migrations: f, Reloader: f, Draining: draining})
}

// topologyOf is a topology with one pool per entry, of servers up or down as given.
func topologyOf(t *testing.T, pools map[string][]bool) fixed {
	t.Helper()
	topo := &topology.Topology{}
	for _, name := range slices.Sorted(maps.Keys(pools)) {
		ups := pools[name]
		var ms []pool.Member
		for i, up := range ups {
			ms = append(ms, pool.Member{Name: name + string(rune('a'+i)), Addr: "127.0.0.1:1", Weight: 1, Server: fakeServer{up: up}})
		}
		pl, err := pool.New(name, pool.Options{}, ms)
		if err != nil {
			t.Fatal(err)
		}
		topo.Pools = append(topo.Pools, pl)
	}
	topo.Default = topo.Pools[0]
	return fixed{t: topo, cfg: config.Default()}
}

func get(h http.Handler, method, path, auth string) (int, string) {
	r := httptest.NewRequest(method, path, nil)
	if auth != "" {
		r.Header.Set("Authorization", auth)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code, w.Body.String()
}

func TestReadyz(t *testing.T) {
	cases := []struct {
		name     string
		pools    map[string][]bool
		required []string
		draining bool
		code     int
		body     string
	}{
		{"every pool has a live server", map[string][]bool{"main": {true, false}, "spare": {true}}, nil, false, 200,
			"ready\npool main: 1 of 2 servers live\npool spare: 1 of 1 servers live\n"},
		{"a pool with every server dead, another live", map[string][]bool{"main": {true}, "spare": {false, false}}, nil, false, 200,
			"ready\npool main: 1 of 1 servers live\npool spare: 0 of 2 servers live\n"},
		{"no pool with a live server", map[string][]bool{"main": {false}, "spare": {false, false}}, nil, false, 503,
			"no live server in any pool\npool main: 0 of 1 servers live\npool spare: 0 of 2 servers live\n"},
		{"a required pool with every server dead", map[string][]bool{"main": {true}, "spare": {false, false}}, []string{"main", "spare"}, false, 503,
			"no live server in pool spare (readiness.pools)\npool main: 1 of 1 servers live\npool spare: 0 of 2 servers live\n"},
		{"required pools live, another dead", map[string][]bool{"main": {true}, "spare": {false, false}}, []string{"main"}, false, 200,
			"ready\npool main: 1 of 1 servers live\npool spare: 0 of 2 servers live\n"},
		{"draining", map[string][]bool{"main": {true}}, nil, true, 503, "draining: moxi is shutting down\npool main: 1 of 1 servers live\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Readiness.Pools = c.required
			h := topologyOf(t, c.pools).with(cfg).handler(func() bool { return c.draining })
			if code, body := get(h, "GET", "/readyz", ""); code != c.code || body != c.body {
				t.Errorf("GET /readyz = %d %q, want %d %q", code, body, c.code, c.body)
			}
			if code, _ := get(h, "GET", "/healthz", ""); code != 200 {
				t.Errorf("GET /healthz = %d, want 200 (liveness whatever the servers)", code)
			}
		})
	}
}

func TestAdminToken(t *testing.T) {
	cfg := config.Default()
	cfg.AdminToken = []byte("s3cret")
	h := topologyOf(t, map[string][]bool{"main": {true}}).with(cfg).handler(nil)
	cases := []struct {
		name, method, path, auth string
		code                     int
	}{
		{"config without a token", "GET", "/config", "", 401},
		{"config with another token", "GET", "/config", "Bearer s3cre", 401},
		{"config with basic auth", "GET", "/config", "Basic s3cret", 401},
		{"config with the token", "GET", "/config", "Bearer s3cret", 200},
		{"reload without a token", "POST", "/reload", "", 401},
		{"reload with the token", "POST", "/reload", "Bearer s3cret", 200},
		{"servers without a token", "GET", "/servers", "", 401},
		{"migrations without a token", "GET", "/migrations", "", 401},
		{"migrations with the token", "GET", "/migrations", "bearer s3cret", 200},
		{"metrics stay open", "GET", "/metrics", "", 200},
		{"healthz stays open", "GET", "/healthz", "", 200},
		{"readyz stays open", "GET", "/readyz", "", 200},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, body := get(h, c.method, c.path, c.auth)
			if code != c.code {
				t.Errorf("%s %s (Authorization %q) = %d %q, want %d", c.method, c.path, c.auth, code, body, c.code)
			}
		})
	}
	// Without admin_token_file nothing asks for one.
	open := topologyOf(t, map[string][]bool{"main": {true}}).handler(nil)
	if code, _ := get(open, "GET", "/config", ""); code != 200 {
		t.Errorf("GET /config without admin_token_file = %d, want 200", code)
	}
}

// TestKeyPathsAndPosts: without admin_token_file, the paths that show keys and every POST
// answer loopback clients only; the peer token opens POST /invalidate and nothing else.
func TestKeyPathsAndPosts(t *testing.T) {
	cfg := config.Default()
	cfg.HotCache.PeerToken = []byte("peer")
	open := topologyOf(t, map[string][]bool{"main": {true}}).with(cfg).handler(nil)
	tokenCfg := config.Default()
	tokenCfg.AdminToken, tokenCfg.HotCache.PeerToken = []byte("admin"), []byte("peer")
	guarded := topologyOf(t, map[string][]bool{"main": {true}}).with(tokenCfg).handler(nil)
	const far, near, near6 = "192.0.2.1:1234", "127.0.0.1:1234", "[::1]:1234"
	cases := []struct {
		name                       string
		h                          http.Handler
		method, path, auth, remote string
		refused                    int // 0: let through (whatever the path then answers)
	}{
		{"reload from afar", open, "POST", "/reload", "", far, 403},
		{"reload from loopback", open, "POST", "/reload", "", near, 0},
		{"reload from IPv6 loopback", open, "POST", "/reload", "", near6, 0},
		{"hotkeys from afar", open, "GET", "/hotkeys", "", far, 403},
		{"hotkeys from loopback", open, "GET", "/hotkeys", "", near, 0},
		{"route from afar", open, "GET", "/route?key=a", "", far, 403},
		{"requests from afar", open, "GET", "/requests", "", far, 403},
		{"servers from afar", open, "GET", "/servers", "", far, 0},
		{"metrics from afar", open, "GET", "/metrics", "", far, 0},
		{"invalidate from afar with the peer token", open, "POST", "/invalidate", "Bearer peer", far, 0},
		{"invalidate from afar without it", open, "POST", "/invalidate", "", far, 403},
		{"reload from afar with the peer token", open, "POST", "/reload", "Bearer peer", far, 403},
		{"admin token: hotkeys from afar with it", guarded, "GET", "/hotkeys", "Bearer admin", far, 0},
		{"admin token: hotkeys from loopback without it", guarded, "GET", "/hotkeys", "", near, 401},
		{"admin token: invalidate with the peer token", guarded, "POST", "/invalidate", "Bearer peer", far, 0},
		{"admin token: invalidate with the admin token", guarded, "POST", "/invalidate", "Bearer admin", far, 0},
		{"admin token: reload with the peer token", guarded, "POST", "/reload", "Bearer peer", near, 401},
		{"admin token: config with the peer token", guarded, "GET", "/config", "Bearer peer", near, 401},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(c.method, c.path, nil)
			r.RemoteAddr = c.remote
			if c.auth != "" {
				r.Header.Set("Authorization", c.auth)
			}
			w := httptest.NewRecorder()
			c.h.ServeHTTP(w, r)
			switch {
			case c.refused != 0 && w.Code != c.refused:
				t.Errorf("%s %s from %s = %d %q, want %d", c.method, c.path, c.remote, w.Code, w.Body, c.refused)
			case c.refused == 0 && (w.Code == 401 || w.Code == 403):
				t.Errorf("%s %s from %s = %d %q, want it let through", c.method, c.path, c.remote, w.Code, w.Body)
			}
		})
	}
}

// TestHalfSentRequestsDropped: clients that send half a request are disconnected when
// the header timeout passes, or at once when newer connections need their slots, and a
// whole request is served afterwards.
func TestHalfSentRequestsDropped(t *testing.T) {
	b := DefaultBounds
	b.ReadHeaderTimeout, b.MaxConns = 300*time.Millisecond, 8
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(topologyOf(t, map[string][]bool{"main": {true}}).handler(nil), b, nil)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(Listen(ln, b)) }()
	defer func() {
		srv.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Error(err)
		}
	}()

	const clients = 100
	start := time.Now()
	conns := make([]net.Conn, clients)
	for i := range conns {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: moxi\r\nX-Half: "); err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	for i, c := range conns {
		_ = c.SetReadDeadline(start.Add(10 * time.Second)) // a bound for a broken server; the check is below
		n, err := io.Copy(io.Discard, c)                   // until the server closes it (an answer such as 408 may come first)
		// EOF, or a reset for a connection closed with its request unread, is the point.
		if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("client %d: not disconnected after %v (%d bytes read): %v", i, time.Since(start), n, err)
		}
	}
	// Generous on a loaded machine, yet far below what an unbounded server would take (never).
	if took := time.Since(start); took > b.ReadHeaderTimeout+3*time.Second {
		t.Errorf("%d half-sent requests took %v to be dropped with a header timeout of %v", clients, took, b.ReadHeaderTimeout)
	}

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: moxi\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || strings.TrimSpace(string(body)) != "ok" {
		t.Errorf("GET /healthz after the flood = %d %q", resp.StatusCode, body)
	}
}

// TestConfigInfo: moxi_config_info's hash follows the config in service: equal for equal
// configs, whatever their listen and admin addresses, and different for different ones.
func TestConfigInfo(t *testing.T) {
	hashOf := func(cfg *config.Config) string {
		reg := prometheus.NewRegistry()
		reg.MustRegister(ConfigInfo(fixed{cfg: cfg}))
		fams, err := reg.Gather()
		if err != nil || len(fams) != 1 || len(fams[0].GetMetric()) != 1 {
			t.Fatalf("moxi_config_info: %v %v", fams, err)
		}
		m := fams[0].GetMetric()[0]
		if m.GetGauge().GetValue() != 1 || len(m.GetLabel()) != 1 || m.GetLabel()[0].GetName() != "hash" {
			t.Fatalf("moxi_config_info = %v", m)
		}
		return m.GetLabel()[0].GetValue()
	}
	a, b, c := config.Default(), config.Default(), config.Default()
	b.Listen, b.Admin = "127.0.0.1:1", "127.0.0.1:2"
	c.HotCache.Prefixes = []string{"hot:"}
	if hashOf(a) != hashOf(b) {
		t.Errorf("configs that differ only in listen and admin hash apart: %s, %s", hashOf(a), hashOf(b))
	}
	if hashOf(a) == hashOf(c) {
		t.Errorf("configs that differ in hot_cache.prefixes hash alike: %s", hashOf(a))
	}
}

// TestIndex: GET / lists every endpoint, each of which Handler serves (pprof with Pprof
// set), and docs/operating.md's table names each.
func TestIndex(t *testing.T) {
	f := topologyOf(t, map[string][]bool{"main": {true}})
	h := Handler(Sources{Registry: prometheus.NewRegistry(), Topologies: f, Migrations: f, Reloader: f, Pprof: true})
	code, body := get(h, "GET", "/", "")
	if code != 200 {
		t.Fatalf("GET / = %d %q", code, body)
	}
	doc, err := os.ReadFile("../../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range Endpoints {
		if !strings.Contains(body, e.Pattern) {
			t.Errorf("GET / does not list %s:\n%s", e.Pattern, body)
		}
		method, path, _ := strings.Cut(e.Pattern, " ")
		if code, _ := get(h, method, path, ""); code == http.StatusNotFound || code == http.StatusMethodNotAllowed {
			t.Errorf("%s listed but answered %d", e.Pattern, code)
		}
		if !strings.Contains(string(doc), "`"+e.Pattern) {
			t.Errorf("docs/operating.md's table does not name %s", e.Pattern)
		}
	}
	if code, _ := get(h, "GET", "/nothing", ""); code != http.StatusNotFound {
		t.Errorf("GET /nothing = %d, want 404", code)
	}
}
