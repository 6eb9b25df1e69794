// Package admin is the operator's view of a running moxi: the HTTP endpoints of docs/operating.md
// (/metrics, /healthz, /readyz, /servers, /migrations, /reload, /config, /debug/pprof/) and
// the Prometheus collectors that read the running topology at scrape time.
package admin

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/migrate"
	"github.com/moxi-proxy/moxi/internal/reqlog"
	"github.com/moxi-proxy/moxi/internal/topology"
)

// Topologies gives the topology in service: the proxy.
type Topologies interface {
	Topology() *topology.Topology
}

// Migrations lists the running topology's migrations: the topology builder.
type Migrations interface {
	Migrations() []migrate.Status
}

// Reloader puts the config file in service again, and tells which config is in service.
type Reloader interface {
	Reload(source string) (summary string, err error)
	Config() *config.Config
}

// Sources are what the endpoints read.
type Sources struct {
	Registry   *prometheus.Registry
	Topologies Topologies
	Migrations Migrations
	Reloader   Reloader    // its Config's AdminToken, when set, guards every path but the open ones
	Draining   func() bool // reports that moxi is shutting down: /readyz answers 503; nil = never
	Pprof      bool        // serve /debug/pprof/
	// Invalidator takes POST /invalidate's keys (a peer's writes); nil: the path is not served.
	Invalidator Invalidator
	// Requests is the request log GET /requests streams; nil: the path is not served.
	Requests *reqlog.Log
	// Upgrader upgrades moxi in place (POST /upgrade); nil: the path is not served.
	Upgrader Upgrader
}

// Upgrader upgrades the process in place (SIGUSR2, POST /upgrade): it returns once the
// successor is ready, or with why not (ErrUpgrading while one runs).
type Upgrader interface {
	Upgrade() error
}

// ErrUpgrading is Upgrade's answer while an upgrade is under way.
var ErrUpgrading = errors.New("an upgrade is under way")

// openPaths are served without the admin token: what probes and Prometheus read, which
// neither changes nor reveals the config.
var openPaths = map[string]bool{"/metrics": true, "/healthz": true, "/readyz": true}

// Starting serves the admin address while moxi waits to serve (the first DNS answers of
// its discover pools): /healthz answers ok, /metrics the registry, and /readyz — every
// other path too — 503 with waiting's reason.
func Starting(reg prometheus.Gatherer, waiting func() string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "starting: "+waiting()+"\n")
	})
	return mux
}

// Endpoints are the admin endpoints, as GET / lists them (docs/operating.md has the same
// table): each pattern is one Handler serves.
var Endpoints = []struct{ Pattern, Doc string }{
	{"GET /metrics", "Prometheus metrics"},
	{"GET /healthz", "liveness: 200 while the process serves"},
	{"GET /readyz", "readiness: 200 while a pool (or each of readiness.pools) has a live server; the body lists every pool"},
	{"GET /servers", "every server and its state, as JSON"},
	{"GET /migrations", "every migration and reshard, as JSON"},
	{"POST /reload", "reload the config file: what changed, or why not"},
	{"GET /config", "the config in service, every default filled in, as YAML"},
	{"GET /hotkeys", "each pool's hottest keys (hot_keys), as JSON"},
	{"GET /route", "where ?key=K goes now (&listener=ADDR, &user=U), as JSON"},
	{"GET /requests", "a live stream of requests (?slow=5ms, sample=0.01, errors=1, prefix=P), JSON lines"},
	{"POST /invalidate", "drop keys from the hot cache (JSON lines from a peer)"},
	{"POST /upgrade", "upgrade in place to the binary at moxi's path (as SIGUSR2)"},
	{"GET /debug/pprof/", "Go's profiles, with --pprof only"},
}

// Handler serves the admin HTTP endpoints (docs/operating.md).
func Handler(src Sources) http.Handler {
	reg, rl := src.Registry, src.Reloader
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "moxi admin endpoints:\n")
		for _, e := range Endpoints {
			fmt.Fprintf(w, "  %-20s %s\n", e.Pattern, e.Doc)
		}
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		draining := src.Draining != nil && src.Draining()
		ready, body := readiness(src.Topologies.Topology(), draining, rl.Config().Readiness.Pools)
		if !ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		io.WriteString(w, body)
	})
	mux.HandleFunc("GET /servers", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, Servers(src.Topologies.Topology()))
	})
	mux.HandleFunc("GET /migrations", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, migrationsJSON(src.Migrations.Migrations()))
	})
	mux.HandleFunc("POST /reload", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		summary, err := rl.Reload("POST /reload")
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, err.Error()+"\n")
			return
		}
		io.WriteString(w, summary)
	})
	mux.HandleFunc("GET /config", func(w http.ResponseWriter, _ *http.Request) {
		out, err := rl.Config().YAML()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/yaml")
		w.Write(out)
	})
	mux.HandleFunc("GET /hotkeys", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, HotKeys(src.Topologies.Topology()))
	})
	mux.HandleFunc("GET /route", routeHandler(src))
	if src.Invalidator != nil {
		mux.HandleFunc("POST /invalidate", invalidate(src.Invalidator))
	}
	if src.Requests != nil {
		mux.HandleFunc("GET /requests", watchRequests(src.Requests))
	}
	if src.Upgrader != nil {
		mux.HandleFunc("POST /upgrade", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			switch err := src.Upgrader.Upgrade(); {
			case errors.Is(err, ErrUpgrading):
				http.Error(w, err.Error(), http.StatusConflict)
			case err != nil:
				http.Error(w, "upgrade failed, this process keeps serving: "+err.Error(), http.StatusInternalServerError)
			default:
				io.WriteString(w, "upgrading: the successor is ready and takes the client connections over\n")
			}
		})
	}
	if src.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if code, why := refused(rl.Config(), r); code != 0 {
			if code == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="moxi admin"`)
			}
			http.Error(w, why, code)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// keyPaths show keys, which are the clients' data: like every POST, they answer loopback
// clients only unless an admin token guards them.
var keyPaths = map[string]bool{"/route": true, "/hotkeys": true, "/requests": true}

// peerPath is what the peer token (hot_cache.peer_token_file) opens, and nothing else.
const peerPath = "/invalidate"

// refused is why r may not be served (an HTTP status and its text), or 0. The tokens are
// the running config's: a reload that rotates a file rotates its token.
func refused(cfg *config.Config, r *http.Request) (int, string) {
	if openPaths[r.URL.Path] {
		return 0, ""
	}
	if r.Method == http.MethodPost && r.URL.Path == peerPath && len(cfg.HotCache.PeerToken) > 0 && bearer(r, cfg.HotCache.PeerToken) {
		return 0, ""
	}
	if token := cfg.AdminToken; len(token) > 0 {
		if bearer(r, token) {
			return 0, ""
		}
		return http.StatusUnauthorized, "401 unauthorized: this path needs \"Authorization: Bearer <the content of admin_token_file>\""
	}
	if (r.Method == http.MethodPost || keyPaths[r.URL.Path]) && !loopback(r.RemoteAddr) {
		return http.StatusForbidden, "403 forbidden: without admin_token_file, " + r.Method + " " + r.URL.Path + " answers loopback clients only"
	}
	return 0, ""
}

// loopback reports whether addr (a request's RemoteAddr, host:port) is a loopback address.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// bearer reports whether r carries "Authorization: Bearer <token>", compared in constant
// time so that the answer's timing tells nothing of the token.
func bearer(r *http.Request, token []byte) bool {
	scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), token) == 1
}

// readiness is /readyz's answer: whether moxi should get new clients, and a body whose first
// line says why not (or "ready") and whose other lines give every pool's live servers. It
// is not ready while draining, or while a pool of required (readiness.pools) has no live
// server — or, required empty, while no pool has one: a pool whose servers are all dead
// fails its own keys, and taking the proxy out of service would fail every other pool's
// too. An embedded pool always has a live server.
func readiness(t *topology.Topology, draining bool, required []string) (ready bool, body string) {
	var b strings.Builder
	var dead []string
	live := 0
	for _, pl := range t.Pools {
		up := 0
		for i := range pl.Len() {
			if pl.Member(i).Up() {
				up++
			}
		}
		fmt.Fprintf(&b, "pool %s: %d of %d servers live\n", pl.Name(), up, pl.Len())
		if up == 0 {
			dead = append(dead, pl.Name())
		} else {
			live++
		}
	}
	var missing []string
	for _, name := range required {
		if slices.Contains(dead, name) {
			missing = append(missing, name)
		}
	}
	reason := "ready"
	switch {
	case draining:
		reason = "draining: moxi is shutting down"
	case len(missing) > 0:
		reason = "no live server in pool " + strings.Join(missing, ", ") + " (readiness.pools)"
	case len(required) == 0 && live == 0:
		reason = "no live server in any pool"
	}
	return reason == "ready", reason + "\n" + b.String()
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
