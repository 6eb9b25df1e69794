// Package reload puts a changed config file in service without a restart: a new topology is
// built beside the running one, reusing its unchanged servers, and swapped in whole; a file
// that fails to load or build changes nothing.
package reload

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/topology"
)

// WatchInterval is how often Watch looks at the file.
const WatchInterval = time.Second

// Sum identifies the bytes a config was parsed from. The zero Sum is the built-in default.
type Sum [sha256.Size]byte

// Loaded is a config and the identity of the bytes it was parsed from: the watcher compares
// the file against what was last applied, not against what it saw last.
type Loaded struct {
	Config *config.Config
	Sum    Sum
}

// Load reads and parses the file at path, or the built-in default when path is "", reads
// the TLS files it names (config.LoadTLS: so every reload rereads rotated certificates),
// and then lets override adjust it (the command line's --listen and --admin); override may
// be nil. When the file was read but is not a valid config, the error comes with Sum set and
// no Config.
func Load(path string, override func(*config.Config) error) (Loaded, error) {
	var l Loaded
	if path == "" {
		l.Config = config.Default()
	} else {
		data, err := os.ReadFile(path)
		if err != nil {
			return Loaded{}, fmt.Errorf("read config: %w", err)
		}
		l.Sum = sha256.Sum256(data)
		if l.Config, err = config.Read(data, path); err != nil {
			return Loaded{Sum: l.Sum}, err
		}
	}
	if override != nil {
		if err := override(l.Config); err != nil {
			return Loaded{Sum: l.Sum}, err
		}
	}
	if err := l.Config.CheckLoops(path); err != nil {
		return Loaded{Sum: l.Sum}, err
	}
	return l, nil
}

// Options configure a Reloader.
type Options struct {
	Path     string                     // the config file; "" = the built-in default, nothing to reload
	Override func(*config.Config) error // applied after every load (command-line flags); may be nil
	Builder  *topology.Builder          // builds the new topology beside the running one
	Swap     func(t *topology.Topology) // puts a built topology in service (the proxy's Swap)
	// Installed, when set, is told of each config put in service after the first, once its
	// topology is: what the config sets outside the topology (client authentication)
	// follows it.
	Installed func(*config.Config)
	Initial   *topology.Topology                 // the topology in service when New is called
	Logger    *slog.Logger                       // nil = slog.Default()
	Registry  prometheus.Registerer              // moxi_config_reloads_total goes here; nil = not exported
	Grace     func(*config.Config) time.Duration // how long a request may take under a config
	Interval  time.Duration                      // how often Watch looks at the file; default WatchInterval
}

// Reloader applies the config file to the running moxi, one reload at a time. Safe for
// concurrent use: SIGHUP, POST /reload and the watcher may ask at once.
type Reloader struct {
	opts    Options
	startup *config.Config // the config moxi started with: restart-only settings are compared to it
	reloads *prometheus.CounterVec
	current atomic.Pointer[config.Config]

	// lastOK and lastOKAt are moxi_config_last_reload_successful and
	// moxi_config_last_reload_success_timestamp_seconds (the start counts as a success).
	lastOK, lastOKAt prometheus.Gauge

	mu        sync.Mutex         // one reload at a time; guards applied, tried and scheduled
	applied   Sum                // the bytes in service
	tried     Sum                // the bytes the watcher last tried, applied or not
	scheduled *scheduled         // a config built and waiting for its apply_at, or nil
	installed *topology.Topology // the topology last put in service, without its schedule

	looks atomic.Int64 // times Watch has read the file: lets tests wait for it to look
}

// scheduled is a config whose apply_at has not come: its topology is built (new servers
// connect meanwhile) and handed to the proxy as the next table from apply_at on
// (topology.Topology.Next), so that requests switch at that instant exactly; timer then
// commits it.
type scheduled struct {
	next    Loaded
	pending *topology.Pending
	timer   *time.Timer
}

// New returns a Reloader for a moxi running initial, which must be in service already.
func New(opts Options, initial Loaded) *Reloader {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	r := &Reloader{opts: opts, startup: initial.Config, applied: initial.Sum, tried: initial.Sum, installed: opts.Initial}
	r.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moxi_config_reloads_total",
		Help: "Config reloads, by result: ok or error.",
	}, []string{"result"})
	r.reloads.WithLabelValues("ok")
	r.reloads.WithLabelValues("error")
	r.lastOK = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "moxi_config_last_reload_successful",
		Help: "1 when the last config reload succeeded (or none was tried since start), 0 when it failed.",
	})
	r.lastOKAt = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "moxi_config_last_reload_success_timestamp_seconds",
		Help: "When the config in service was loaded: the last successful reload, or the start.",
	})
	r.lastOK.Set(1)
	r.lastOKAt.SetToCurrentTime()
	reg.MustRegister(r.reloads, r.lastOK, r.lastOKAt)
	r.current.Store(initial.Config)
	return r
}

// Config is the config in service.
func (r *Reloader) Config() *config.Config { return r.current.Load() }

// Reload loads the config file again and puts it in service. It returns a summary of what
// changed, one line each, or why nothing did. source names who asked, for the log.
func (r *Reloader) Reload(source string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reloadLocked(source)
}

func (r *Reloader) reloadLocked(source string) (string, error) {
	summary, err := r.apply()
	if err != nil {
		r.reloads.WithLabelValues("error").Inc()
		r.lastOK.Set(0)
		r.opts.Logger.Error("config reload rejected; the running topology is kept", "source", source, "err", err)
		return "", err
	}
	r.reloads.WithLabelValues("ok").Inc()
	r.lastOK.Set(1)
	r.lastOKAt.SetToCurrentTime()
	r.opts.Logger.Info("config reloaded", "source", source, "changes", strings.ReplaceAll(strings.TrimSpace(summary), "\n", "; "))
	return summary, nil
}

// apply is one reload; the caller holds mu.
func (r *Reloader) apply() (string, error) {
	if r.opts.Path == "" {
		return "", errors.New("moxi runs its built-in default (no --config): there is no file to reload")
	}
	next, err := Load(r.opts.Path, r.opts.Override)
	r.tried = next.Sum
	if err != nil {
		return "", err
	}
	r.unschedule() // a newer file replaces a config still waiting, or follows one in service
	prev := r.current.Load()
	pending, err := r.opts.Builder.Build(next.Config)
	if err != nil {
		return "", err
	}
	changes := config.DiffSince(r.startup, prev, next.Config)
	summary := "no changes\n"
	if len(changes) > 0 {
		summary = strings.Join(changes, "\n") + "\n"
	}
	if at := next.Config.ApplyAt; time.Now().Before(at) && r.installed != nil {
		s := &scheduled{next: next, pending: pending}
		r.opts.Swap(r.installed.Until(at, pending.Topology))
		s.timer = time.AfterFunc(time.Until(at), func() { r.applyScheduled(s) })
		r.scheduled = s
		return "scheduled for apply_at " + at.UTC().Format(time.RFC3339Nano) + "\n" + summary, nil
	}
	r.install(next, pending)
	return summary, nil
}

// install puts a built config in service; the caller holds mu.
func (r *Reloader) install(next Loaded, pending *topology.Pending) {
	prev := r.current.Load()
	r.opts.Swap(pending.Topology)
	r.installed = pending.Topology
	grace := time.Duration(0)
	if r.opts.Grace != nil {
		grace = max(r.opts.Grace(prev), r.opts.Grace(next.Config))
	}
	pending.Commit(grace)
	r.current.Store(next.Config)
	r.applied = next.Sum
	if r.opts.Installed != nil {
		r.opts.Installed(next.Config)
	}
}

// Refresh puts the config in service again with what fill makes of it — its discover
// pools' servers as DNS now answers (package discover) — and a config waiting for its
// apply_at as well, as a reload with those lists would: the file is not read again. It
// returns what changed, one line each. fill must not change the config it is given.
func (r *Reloader) Refresh(source string, fill func(*config.Config) (*config.Config, error)) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	prev := r.current.Load()
	next, err := fill(prev)
	if err != nil {
		return "", err
	}
	changes := config.DiffSince(r.startup, prev, next)
	if len(changes) == 0 && r.scheduled == nil {
		return "no changes\n", nil
	}
	pending, err := r.opts.Builder.Build(next)
	if err != nil {
		r.opts.Logger.Error("discovered servers not applied; the running topology is kept", "source", source, "err", err)
		return "", err
	}
	r.install(Loaded{Config: next, Sum: r.applied}, pending)
	if s := r.scheduled; s != nil {
		// install put the running table in service without its schedule: give it back,
		// with the waiting config's table rebuilt for the new lists (on the servers just
		// put in service). If that fails the waiting config keeps its old lists.
		waiting, err := fill(s.next.Config)
		var waitingPending *topology.Pending
		if err == nil {
			waitingPending, err = r.opts.Builder.Build(waiting)
		}
		if err != nil {
			r.opts.Logger.Error("discovered servers not applied to the config waiting for its apply_at", "source", source, "err", err)
		} else {
			s.pending.Abort()
			s.next.Config, s.pending = waiting, waitingPending
		}
		r.opts.Swap(r.installed.Until(s.next.Config.ApplyAt, s.pending.Topology))
	}
	summary := "no changes\n"
	if len(changes) > 0 {
		summary = strings.Join(changes, "\n") + "\n"
	}
	r.opts.Logger.Info("discovered servers applied", "source", source, "changes", strings.ReplaceAll(strings.TrimSpace(summary), "\n", "; "))
	return summary, nil
}

// applyScheduled puts s in service at its apply_at, unless a newer reload replaced it.
func (r *Reloader) applyScheduled(s *scheduled) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.scheduled != s {
		return // installed or dropped by unschedule
	}
	r.scheduled = nil
	r.install(s.next, s.pending)
	r.opts.Logger.Info("config applied at its apply_at", "apply_at", s.next.Config.ApplyAt)
}

// unschedule settles the config waiting for its apply_at, if any; the caller holds mu.
// Before apply_at it is dropped, and the proxy's table loses its schedule; from apply_at
// on requests use it already, so it is installed.
func (r *Reloader) unschedule() {
	s := r.scheduled
	if s == nil {
		return
	}
	r.scheduled = nil
	s.timer.Stop() // applyScheduled, if the timer fired, finds s settled
	if time.Now().Before(s.next.Config.ApplyAt) {
		r.opts.Swap(r.installed)
		s.pending.Abort()
		return
	}
	r.install(s.next, s.pending)
}

// Stop settles a config waiting for its apply_at (see unschedule): at shutdown nothing
// is left scheduled.
func (r *Reloader) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unschedule()
}

// Watch reloads when the config file's content differs from what is in service, while
// watch_config is on, until ctx ends. It reads the file through any symlinks (a Kubernetes
// ConfigMap update swaps a symlink to a new directory) every WatchInterval; content that
// failed to load is not tried again until it changes.
func (r *Reloader) Watch(ctx context.Context) {
	if r.opts.Path == "" {
		return
	}
	interval := r.opts.Interval
	if interval <= 0 {
		interval = WatchInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !r.Config().WatchConfig {
			continue
		}
		data, err := os.ReadFile(r.opts.Path)
		if err != nil || len(strings.TrimSpace(string(data))) == 0 {
			continue // missing or empty for a moment (mid-write): look again
		}
		sum := Sum(sha256.Sum256(data))
		r.mu.Lock()
		switch sum {
		case r.applied:
			r.tried = sum // back to what is in service: a later edit is new again
		case r.tried:
			// failed to load before, unchanged since
		default:
			_, _ = r.reloadLocked("file change")
		}
		r.looks.Add(1)
		r.mu.Unlock()
	}
}
