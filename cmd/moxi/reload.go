package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/proxy"
	"github.com/moxi-proxy/moxi/internal/topology"
)

// watchInterval is how often watch_config looks at the file.
const watchInterval = time.Second

// reloader applies a changed config file to the running moxi: a new topology is built
// beside the running one, reusing its unchanged servers, and swapped in whole; a file that
// fails to load or build changes nothing.
type reloader struct {
	opts    *options
	builder *topology.Builder
	px      *proxy.Proxy
	logger  *slog.Logger
	reloads *prometheus.CounterVec

	mu      sync.Mutex // one reload at a time
	current atomic.Pointer[config.Config]
}

func newReloader(o *options, cfg *config.Config, b *topology.Builder, px *proxy.Proxy, logger *slog.Logger, reg prometheus.Registerer) *reloader {
	r := &reloader{opts: o, builder: b, px: px, logger: logger}
	r.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moxi_config_reloads_total",
		Help: "Config reloads, by result: ok or error.",
	}, []string{"result"})
	r.reloads.WithLabelValues("ok")
	r.reloads.WithLabelValues("error")
	reg.MustRegister(r.reloads)
	r.current.Store(cfg)
	return r
}

// config is the config in service.
func (r *reloader) config() *config.Config { return r.current.Load() }

// reload loads the config file again and puts it in service. It returns a summary of what
// changed, or why nothing did.
func (r *reloader) reload(source string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	summary, err := r.apply()
	if err != nil {
		r.reloads.WithLabelValues("error").Inc()
		r.logger.Error("config reload rejected; the running topology is kept", "source", source, "err", err)
		return "", err
	}
	r.reloads.WithLabelValues("ok").Inc()
	r.logger.Info("config reloaded", "source", source, "changes", strings.TrimSpace(strings.ReplaceAll(summary, "\n", "; ")))
	return summary, nil
}

func (r *reloader) apply() (string, error) {
	if r.opts.configPath == "" {
		return "", errors.New("moxi runs its built-in default (no --config): there is no file to reload")
	}
	next, err := loadConfig(r.opts)
	if err != nil {
		return "", err
	}
	prev := r.current.Load()
	pending, err := r.builder.Build(next)
	if err != nil {
		return "", err
	}
	r.px.Swap(pending.Topology)
	r.builder.Grace = max(grace(prev), grace(next))
	pending.Commit()
	r.current.Store(next)
	return describeChanges(prev, next), nil
}

// describeChanges says what a reload changed, one line each, and what it could not change
// without a restart.
func describeChanges(prev, next *config.Config) string {
	var b strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	for _, np := range next.Pools {
		pp := prev.Pool(np.Name)
		switch {
		case pp == nil:
			line("pool %s: added", np.Name)
		case !samePool(pp, np):
			line("pool %s: changed", np.Name)
		}
	}
	for _, pp := range prev.Pools {
		if next.Pool(pp.Name) == nil {
			line("pool %s: removed", pp.Name)
		}
	}
	if !reflect.DeepEqual(prev.Routes, next.Routes) || prev.DefaultPool != next.DefaultPool {
		line("routes: changed")
	}
	if prev.Dedup != next.Dedup || !reflect.DeepEqual(prev.HotCache, next.HotCache) || !reflect.DeepEqual(prev.FireAndForget.Prefixes, next.FireAndForget.Prefixes) {
		line("dedup, hot_cache or fire_and_forget prefixes: changed")
	}
	restart := func(what string, changed bool) {
		if changed {
			line("%s: changed in the file, takes effect at the next restart", what)
		}
	}
	restart("listen", prev.Listen != next.Listen)
	restart("admin", prev.Admin != next.Admin)
	restart("limits", prev.Limits != next.Limits)
	restart("fire_and_forget.max_pending", prev.FireAndForget.MaxPending != next.FireAndForget.MaxPending)
	if b.Len() == 0 {
		return "no changes\n"
	}
	return b.String()
}

// samePool compares two pools' settings, ignoring where in the file they were written.
func samePool(a, b *config.Pool) bool {
	ac, bc := *a, *b
	ac.Servers, bc.Servers = withoutLines(a.Servers), withoutLines(b.Servers)
	return reflect.DeepEqual(ac, bc)
}

func withoutLines(servers []config.Server) []config.Server {
	out := make([]config.Server, len(servers))
	for i, s := range servers {
		s.Line = 0
		out[i] = s
	}
	return out
}

// watch reloads when the config file changes, while watch_config is on, until ctx ends. It
// looks at the file's identity (device, inode, size, mtime) through any symlinks — a
// Kubernetes ConfigMap update swaps a symlink to a new directory — and at its content, so
// that a touch or an identical rewrite reloads nothing.
func (r *reloader) watch(ctx context.Context) {
	if r.opts.configPath == "" {
		return
	}
	lastID, lastSum := fileIdentity(r.opts.configPath)
	t := time.NewTicker(watchInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !r.config().WatchConfig {
			continue
		}
		id, sum := fileIdentity(r.opts.configPath)
		if id == lastID || sum == ([32]byte{}) {
			continue // unchanged, or unreadable or empty for a moment (mid-write): look again
		}
		lastID = id
		if sum == lastSum {
			continue // touched or rewritten with the same content
		}
		lastSum = sum
		_, _ = r.reload("file change")
	}
}

// fileIdentity is what watch compares: the file's stat identity, and its content's hash
// (zero when unreadable).
func fileIdentity(path string) (string, [32]byte) {
	fi, err := os.Stat(path)
	if err != nil {
		return "missing", [32]byte{}
	}
	id := fmt.Sprintf("%d/%d", fi.Size(), fi.ModTime().UnixNano())
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		id += fmt.Sprintf("/%d/%d", st.Dev, st.Ino)
	}
	data, err := os.ReadFile(path)
	if err != nil || len(bytes.TrimSpace(data)) == 0 {
		return id, [32]byte{}
	}
	return id, sha256.Sum256(data)
}
