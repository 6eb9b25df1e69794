// Package admin is the operator's view of a running moxi: the HTTP endpoints of the contract
// (/metrics, /healthz, /servers, /migrations, /reload, /config, /debug/pprof/) and the
// Prometheus collectors that read the running topology at scrape time.
package admin

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/pprof"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/migrate"
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
	Reloader   Reloader
	Pprof      bool // serve /debug/pprof/
}

// Handler serves the admin HTTP endpoints of the contract.
func Handler(src Sources) http.Handler {
	reg, rl := src.Registry, src.Reloader
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
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
	if src.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
