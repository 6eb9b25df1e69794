package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/moxi-proxy/moxi/internal/migrate"
	"github.com/moxi-proxy/moxi/internal/proxy"
)

// adminHandler serves the admin HTTP endpoints of the contract.
func adminHandler(reg *prometheus.Registry, px *proxy.Proxy, rl *reloader, withPprof bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /servers", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, px.Servers())
	})
	mux.HandleFunc("GET /migrations", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, migrationsJSON(rl.builder.Migrations()))
	})
	mux.HandleFunc("POST /reload", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		summary, err := rl.reload("POST /reload")
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, err.Error()+"\n")
			return
		}
		io.WriteString(w, summary)
	})
	mux.HandleFunc("GET /config", func(w http.ResponseWriter, _ *http.Request) {
		out, err := rl.config().YAML()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/yaml")
		w.Write(out)
	})
	if withPprof {
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

// migration is one entry of GET /migrations.
type migration struct {
	Pool       string `json:"pool"`
	Name       string `json:"name"`
	From       string `json:"from"`
	To         string `json:"to"`
	Phase      string `json:"phase"`
	KeysCopied int64  `json:"keys_copied"`
	KeysTotal  int64  `json:"keys_total"`
	Started    string `json:"started"`
	Finished   string `json:"finished"`
	Error      string `json:"error"`
}

func migrationsJSON(sts []migrate.Status) []migration {
	out := make([]migration, 0, len(sts))
	stamp := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	for _, st := range sts {
		out = append(out, migration{st.Pool, st.Name, st.From, st.To, st.Phase, st.KeysCopied, st.KeysTotal, stamp(st.Started), stamp(st.Finished), st.Err})
	}
	return out
}
