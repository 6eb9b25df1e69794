// Command moxi is a memcached proxy: clients speak memcached's text or binary protocol to
// it, and it routes every key to the pool and server that own it.
package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/moxi-proxy/moxi"
	"github.com/moxi-proxy/moxi/internal/admin"
	"github.com/moxi-proxy/moxi/internal/auth"
	"github.com/moxi-proxy/moxi/internal/auth/limit"
	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/discover"
	"github.com/moxi-proxy/moxi/internal/frontend"
	"github.com/moxi-proxy/moxi/internal/peers"
	"github.com/moxi-proxy/moxi/internal/procs"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/proxy"
	"github.com/moxi-proxy/moxi/internal/reload"
	"github.com/moxi-proxy/moxi/internal/reqlog"
	"github.com/moxi-proxy/moxi/internal/route"
	"github.com/moxi-proxy/moxi/internal/sdnotify"
	"github.com/moxi-proxy/moxi/internal/topology"
)

// version is the build string, set at build time with -ldflags "-X main.version=…" ("" for
// a plain go build). The release number comes from the VERSION file (moxi.Release); the
// build string never takes its place in answers that clients parse as a memcached version.
var version = ""

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// options are the command-line flags; nil string pointers mean "not given".
type options struct {
	configPath string
	listen     *string
	admin      *string
	logLevel   string
	logFormat  string
	check      bool
	version    bool
	pprof      bool
	twemproxy  string  // --from-twemproxy: a nutcracker.yml to print as moxi config
	zone       *string // the zone: --zone or MOXI_ZONE, else the first config's (override pins it)
}

// usageHead and usageExamples frame the flags in --help.
const (
	usageHead = `moxi is a memcached proxy: applications speak memcached's text, meta or binary protocol
to it, and it routes each key to the pool and server that own it.

Usage: moxi [flags]

Flags:
`
	usageExamples = `
Examples:
  moxi                                       a cache on 127.0.0.1:11211 (2 embedded shards), admin on 127.0.0.1:9151
  moxi --config /etc/moxi/moxi.yaml          serve a topology; SIGHUP or a change of the file reloads it
  moxi --check --config moxi.yaml            validate a config and print it with every default filled in
  moxi --from-twemproxy nutcracker.yml       print the moxi config equivalent to a twemproxy one
`
)

// usage writes --help: what moxi is, every flag with its meaning, and examples.
func usage(fs *flag.FlagSet, w io.Writer) {
	io.WriteString(w, usageHead)
	fs.VisitAll(func(f *flag.Flag) {
		arg, meaning := flag.UnquoteUsage(f)
		name := "--" + f.Name
		if arg != "" {
			name += " " + arg
		}
		if f.DefValue != "" && f.DefValue != "false" {
			meaning += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(w, "  %-26s %s\n", name, meaning)
	})
	io.WriteString(w, usageExamples)
}

// parseFlags reads the command line. flag.ErrHelp means --help was asked for; any other
// error is a usage error, which the caller prints (once).
func parseFlags(args []string) (*options, *flag.FlagSet, error) {
	fs := flag.NewFlagSet("moxi", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned and printed once by run; --help goes to stdout
	o := &options{}
	var listen, admin string
	fs.StringVar(&o.configPath, "config", "", "YAML topology `file`; without it moxi runs its built-in default (2 embedded shards)")
	fs.StringVar(&listen, "listen", "", "client `address`, overrides the config's listen")
	fs.StringVar(&admin, "admin", "", "admin HTTP `address`, overrides the config's admin (\"\" turns it off)")
	fs.StringVar(&o.logLevel, "log-level", "info", "log `level`: debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "text", "log `format`: text or json")
	fs.BoolVar(&o.check, "check", false, "validate the config, print the effective topology and exit")
	fs.BoolVar(&o.version, "version", false, "print the version and exit")
	fs.BoolVar(&o.pprof, "pprof", false, "serve /debug/pprof/ on the admin address")
	fs.StringVar(&o.twemproxy, "from-twemproxy", "", "print the moxi config equivalent to a twemproxy nutcracker.yml `file` and exit")
	var zone string
	fs.StringVar(&zone, "zone", "", "this proxy's availability `zone`, overrides MOXI_ZONE and the config's zone")
	if err := fs.Parse(args); err != nil {
		return nil, fs, err
	}
	if fs.NArg() > 0 {
		return nil, fs, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "listen":
			o.listen = &listen
		case "admin":
			o.admin = &admin
		case "zone":
			o.zone = &zone
		}
	})
	if z, ok := os.LookupEnv("MOXI_ZONE"); ok && o.zone == nil {
		o.zone = &z
	}
	return o, fs, nil
}

// override applies the address flags to a loaded config, and pins its zone: --zone, else
// MOXI_ZONE, else the zone of the file moxi started with, which a reload does not change.
func (o *options) override(cfg *config.Config) error {
	if o.zone == nil {
		z := cfg.Zone
		o.zone = &z
	} else if err := config.CheckZoneName(*o.zone); err != nil {
		return fmt.Errorf("--zone (or MOXI_ZONE): %w", err)
	}
	cfg.Zone = *o.zone
	if o.listen != nil {
		addr, err := config.ListenAddr(*o.listen)
		if err != nil {
			return fmt.Errorf("--listen: %w", err)
		}
		cfg.Listen = addr
	}
	if o.admin != nil && *o.admin != "" {
		addr, err := config.AdminAddr(*o.admin)
		if err != nil {
			return fmt.Errorf("--admin: %w", err)
		}
		cfg.Admin = addr
	} else if o.admin != nil {
		cfg.Admin = ""
	}
	return nil
}

func run(args []string, stdout, stderr io.Writer) int {
	o, fs, err := parseFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		usage(fs, stdout)
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "moxi: %v\nRun moxi --help for the flags.\n", err)
		return 2
	}
	if o.version {
		fmt.Fprintln(stdout, "moxi", moxi.Version(version))
		return 0
	}
	if o.twemproxy != "" {
		return fromTwemproxy(o.twemproxy, stdout, stderr)
	}
	logger, err := newLogger(o, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "moxi:", err)
		return 2
	}
	loaded, err := reload.Load(o.configPath, o.override)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if o.check {
		return check(o.configPath, loaded.Config, stdout, stderr)
	}
	if err := serve(loaded, o, logger); err != nil {
		logger.Error("moxi stopped", "err", err)
		return 1
	}
	return 0
}

// check validates cfg as far as building its topology and prints the effective config,
// then on stderr what deserves a second look (warnings) and a summary: the pools, their
// servers and each server's share of its pool's keys.
func check(path string, cfg *config.Config, stdout, stderr io.Writer) int {
	b := &topology.Builder{Logger: slog.New(slog.DiscardHandler)}
	pending, err := b.Build(cfg)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	defer pending.Abort()
	out, err := cfg.YAML()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	stdout.Write(out)
	for _, w := range cfg.Warnings(time.Now()) {
		fmt.Fprintf(stderr, "%s: warning: %s\n", cmp.Or(path, "embedded default"), w)
	}
	fmt.Fprintln(stderr, checkSummary(cmp.Or(path, "embedded default"), pending.Topology))
	return 0
}

// summaryKeys is how many keys checkSummary places to measure each server's share.
const summaryKeys = 100_000

// checkSummary is --check's line on success: "FILE: ok: N pools, M servers; pool P: server
// share, …", each server's share of its pool's keys measured over summaryKeys sample keys.
func checkSummary(name string, t *topology.Topology) string {
	var b strings.Builder
	servers := 0
	for _, pl := range t.Pools {
		servers += pl.Len()
	}
	fmt.Fprintf(&b, "%s: ok: %d pools, %d servers", name, len(t.Pools), servers)
	for _, pl := range t.Pools {
		fmt.Fprintf(&b, "; pool %s:", pl.Name())
		if pl.Len() == 0 {
			b.WriteString(" servers from DNS at start")
			continue
		}
		owned := make([]int, pl.Len())
		key := make([]byte, 0, 32)
		for i := range summaryKeys {
			key = strconv.AppendInt(append(key[:0], "key:"...), int64(i), 10)
			owned[pl.Owner(key)]++
		}
		for i := range pl.Len() {
			sep := ","
			if i == 0 {
				sep = ""
			}
			fmt.Fprintf(&b, "%s %s %.1f%%", sep, pl.Member(i).Name, 100*float64(owned[i])/summaryKeys)
		}
	}
	return b.String()
}

// serve runs moxi until SIGINT or SIGTERM, then shuts down within shutdown_timeout.
// SIGHUP, POST /reload and (with watch_config) a change of the file reload the config.
func serve(loaded reload.Loaded, o *options, logger *slog.Logger) error {
	cfg := loaded.Config
	procsCtx, stopProcs := context.WithCancel(context.Background())
	defer stopProcs()
	go procs.Run(procsCtx, os.Getenv, func(n int) { logger.Debug("threads running Go code", "gomaxprocs", n) })
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// The clients' buckets (metrics.latency_buckets), so that a server's latency and the
	// clients' compare bucket for bucket.
	latencyLabels := []string{"pool", "server"}
	if !cfg.Metrics.PerServer {
		latencyLabels = latencyLabels[:1]
	}
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "moxi_backend_request_duration_seconds",
		Help:    "Time from sending a request to a memcached server to its answer, by server (metrics.per_server) or pool.",
		Buckets: cfg.Metrics.Buckets(),
	}, latencyLabels)
	reg.MustRegister(latency)

	// Started by an upgrade: the predecessor's sockets and state. Else systemd's sockets
	// (socket activation), if it passed any.
	succ, err := fromPredecessor(logger)
	if err != nil {
		return err
	}
	var passed *sockets
	if succ != nil {
		passed = succ.sockets
	} else if passed, err = activated(cfg); err != nil {
		return err
	}

	// Pools whose servers come from DNS: their names are asked now, and moxi serves once
	// each has answered. A later answer that changes a list is applied as a reload with
	// that list would be (rl.Refresh), once the reloader exists.
	disc := discover.New(cfg, discover.Options{Registry: reg, Logger: logger})
	if err := succ.importDiscovery(disc); err != nil {
		return err
	}
	var rl *reload.Reloader // set below, before the first client connects
	rlReady := make(chan struct{})
	discCtx, stopDiscovery := context.WithCancel(context.Background())
	discovering := make(chan struct{})
	go func() {
		defer close(discovering)
		disc.Run(discCtx, func(pool string) {
			select {
			case <-rlReady:
				_, _ = rl.Refresh("DNS answer for pool "+pool, disc.Filled)
			case <-discCtx.Done():
			}
		})
	}()
	defer func() { stopDiscovery(); <-discovering }()
	startingAdmin := cfg.Admin
	if succ != nil {
		startingAdmin = "" // the predecessor serves the admin address until it hands it over
	}
	if err := waitForDiscovery(disc, startingAdmin, reg, logger); err != nil {
		return err
	}
	if err := disc.Fill(cfg); err != nil {
		return err
	}

	features := route.NewShared(route.Options{MaxBackgroundBytes: cfg.Limits.MaxBackgroundBytes, Registry: reg, Logger: logger})
	builder := &topology.Builder{Logger: logger, Dial: true, Latency: latency, LatencyByPool: !cfg.Metrics.PerServer, Features: features}
	if err := succ.resume(builder); err != nil {
		return err
	}
	pending, err := builder.Build(cfg)
	if err != nil {
		return err
	}
	pending.Commit(0) // nothing to retire
	if succ != nil {
		if err := succ.importState(builder, pending.Topology, logger); err != nil {
			return err
		}
	}

	front := &frontend.Server{
		Limits:             topology.Limits(cfg),
		MaxConnections:     cfg.Limits.MaxConnections,
		MaxConnectionBytes: cfg.Limits.MaxConnectionBytes,
		MaxBufferedBytes:   cfg.Limits.MaxBufferedBytes,
		RequestTimeout:     cfg.Limits.RequestTimeout,
		WriteTimeout:       cfg.Limits.WriteTimeout,
		Logger:             logger,
	}
	front.RegisterMetrics(reg)
	front.RequestLog = reqlog.New(reg) // GET /requests
	front.SetAuth(clientAuth(cfg))
	// The other moxi of the tier, told of each write whose key their hot caches may hold.
	notifier := peers.New(peers.Options{Registry: reg, Logger: logger})
	defer notifier.Close()
	px := proxy.New(pending.Topology, proxy.Options{
		Release:         moxi.Release,
		Build:           moxi.Build(version),
		Settings:        func() []protocol.Stat { return settingStats(rl.Config()) },
		Registry:        reg,
		LatencyBuckets:  cfg.Metrics.Buckets(),
		Connections:     front.Connections,
		MaxConnections:  cfg.Limits.MaxConnections,
		MaxPending:      cfg.FireAndForget.MaxPending,
		MaxPendingBytes: cfg.FireAndForget.MaxPendingBytes,
		Features:        features,
		Peers:           notifier,
		Logger:          logger,
	})
	front.Handler, front.Rejected = px, px.CountRejected
	override := func(c *config.Config) error {
		if err := o.override(c); err != nil {
			return err
		}
		return disc.Fill(c)
	}
	rl = reload.New(reload.Options{
		Path: o.configPath, Override: override, Builder: builder, Swap: px.Swap, Initial: pending.Topology,
		Installed: func(c *config.Config) { front.SetAuth(clientAuth(c)) },
		Logger:    logger, Registry: reg, Grace: grace,
	}, loaded)
	close(rlReady)
	peersCtx, stopPeers := context.WithCancel(context.Background())
	followingPeers := make(chan struct{})
	go func() { defer close(followingPeers); followPeers(peersCtx, notifier, rl.Config, logger) }()
	defer func() { stopPeers(); <-followingPeers }()
	reg.MustRegister(admin.NewHotKeyCollector(px))
	reg.MustRegister(admin.NewServerCollector(px, cfg.Metrics.PerServer), admin.NewMigrationCollector(builder), admin.BuildInfo(moxi.Version(version)), admin.ConfigInfo(rl))
	reg.MustRegister(admin.StandInCollectors(builder.StandIns(), topology.MaxStandInKeys)...)

	// The main listener, then the config's listeners; each serves TLS with the files the
	// config in service names for it, so that a reload rotates them.
	serverTLS := func(started *config.TLS, current func(*config.Config) *config.TLS) (func() *tls.Config, error) {
		if started == nil {
			return nil, nil // plaintext
		}
		if started.Config == nil {
			return nil, errors.New("the tls files were not loaded")
		}
		return func() *tls.Config {
			if t := current(rl.Config()); t != nil {
				return t.Config // rotated at each reload
			}
			return started.Config // tls removed from the file: that takes a restart
		}, nil
	}
	var listeners []net.Listener
	closeAll := func() {
		for _, l := range listeners {
			l.Close()
		}
		_ = builder.Close(context.Background())
	}
	mainTLS, err := serverTLS(cfg.TLS, func(c *config.Config) *config.TLS { return c.TLS })
	if err != nil {
		closeAll()
		return fmt.Errorf("listen: %w", err)
	}
	ln, err := listen(cfg.Listen, passed.take(cfg.Listen), mainTLS, logger)
	if err != nil {
		closeAll()
		return listenError("listen", cfg.Listen, "another moxi or memcached? pick another with --listen", err)
	}
	listeners = append(listeners, ln)
	for _, lc := range cfg.Listeners {
		addr := lc.Listen
		lnTLS, err := serverTLS(lc.TLS, func(c *config.Config) *config.TLS {
			for _, l := range c.Listeners {
				if l.Listen == addr {
					return l.TLS
				}
			}
			return nil
		})
		if err != nil {
			closeAll()
			return fmt.Errorf("listener %s: %w", addr, err)
		}
		l, err := listen(addr, passed.take(addr), lnTLS, logger)
		if err != nil {
			closeAll()
			return listenError("listener", addr, "another moxi or memcached? pick another in listeners", err)
		}
		listeners = append(listeners, l)
	}
	up := newUpgrader(os.Args[1:], logger, reg)
	up.front, up.px, up.builder, up.disc = front, px, builder, disc
	up.shutdown = func() time.Duration { return rl.Config().ShutdownTimeout }
	up.requestTimeout = func() time.Duration { return rl.Config().Limits.RequestTimeout }
	up.data = append(up.data, addressed{cfg.Listen, ln})
	for i, lc := range cfg.Listeners {
		up.data = append(up.data, addressed{lc.Listen, listeners[i+1]})
	}
	var adminServer *http.Server
	var draining atomic.Bool // set at SIGINT/SIGTERM: /readyz answers 503 from then on
	if cfg.Admin != "" {
		aln := passed.takeAdmin()
		if aln == nil {
			if aln, err = net.Listen("tcp", cfg.Admin); err != nil {
				closeAll()
				return listenError("admin", cfg.Admin, `another moxi? pick another with --admin, or turn it off with --admin ""`, err)
			}
		}
		up.admin = aln
		adminServer = admin.NewServer(
			admin.Handler(admin.Sources{Registry: reg, Topologies: px, Migrations: builder, Reloader: rl, Draining: draining.Load, Pprof: o.pprof,
				Invalidator: px, Requests: front.RequestLog, Upgrader: up}),
			admin.DefaultBounds, slog.NewLogLogger(logger.Handler(), slog.LevelWarn))
		go func() {
			if err := adminServer.Serve(admin.Listen(aln, admin.DefaultBounds)); err != nil && !errors.Is(err, http.ErrServerClosed) && !up.closing.Load() {
				logger.Error("admin server stopped", "err", err)
			}
		}()
	}
	configName := o.configPath
	if configName == "" {
		configName = "built-in default"
	}
	logger.Info("moxi serving", "version", moxi.Version(version), "config", configName, "listen", ln.Addr().String(), "tls", cfg.TLS != nil, "admin", cfg.Admin, "pools", len(cfg.Pools))
	for i, lc := range cfg.Listeners {
		logger.Info("moxi serving", "listener", listeners[i+1].Addr().String(), "default_pool", lc.DefaultPool, "tls", lc.TLS != nil)
	}

	// Every listener's Serve returns when Shutdown closes it; the first to return for
	// another reason stops moxi.
	served := make(chan error, len(listeners))
	go func() { served <- front.Serve(ln) }()
	for i, lc := range cfg.Listeners {
		go func() { served <- front.ServeWith(listeners[i+1], px.ForListener(lc.Listen)) }()
	}
	watchCtx, stopWatching := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() { defer close(watched); rl.Watch(watchCtx) }()
	if succ != nil {
		handlerFor := func(addr string) frontend.Handler {
			if addr == cfg.Listen {
				return px
			}
			return px.ForListener(addr)
		}
		go func() {
			if err := succ.ready(front, handlerFor, logger); err != nil {
				logger.Warn("upgrade: taking over the client connections stopped", "err", err)
			}
		}()
	} else if err := sdnotify.Notify(sdnotify.Ready); err != nil {
		logger.Warn("systemd notification failed", "err", err)
	}

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR2)
	defer signal.Stop(signals)
	servedLeft := len(listeners) // listeners whose Serve has not returned
	upgraded := false            // the successor took over: only TLS connections are left
	for stopping := false; !stopping; {
		select {
		case err := <-served:
			if up.closing.Load() {
				servedLeft--
				continue // the successor accepts on these sockets now
			}
			stopWatching()
			<-watched
			_ = builder.Close(context.Background())
			return fmt.Errorf("serve: %w", err)
		case <-up.handedAll:
			stopping, upgraded = true, true
		case sig := <-signals:
			switch sig {
			case syscall.SIGHUP:
				_, _ = rl.Reload("SIGHUP")
				continue
			case syscall.SIGUSR2:
				go func() {
					if err := up.Upgrade(); errors.Is(err, admin.ErrUpgrading) {
						logger.Info("SIGUSR2 ignored: an upgrade is under way")
					} // else it logged how it went
				}()
				continue
			}
			logger.Info("stopping", "signal", sig.String(), "timeout", rl.Config().ShutdownTimeout)
			stopping = true
			draining.Store(true)
		}
	}
	stopWatching()
	<-watched
	rl.Stop() // a config waiting for its apply_at is never applied now

	ctx, cancel := context.WithTimeout(context.Background(), rl.Config().ShutdownTimeout)
	defer cancel()
	if upgraded {
		_ = front.Gone(ctx) // TLS connections are served to their end, within shutdown_timeout
	}
	if err := front.Shutdown(ctx); err != nil {
		logger.Warn("shutdown timed out; closed remaining connections", "err", err)
	}
	for range servedLeft {
		<-served
	}
	if err := px.Close(ctx); err != nil {
		logger.Warn("shutdown timed out writing queued fire-and-forget writes or backup copies", "err", err)
	}
	if adminServer != nil {
		_ = adminServer.Shutdown(ctx)
	}
	_ = builder.Close(ctx)
	logger.Info("stopped")
	return nil
}

// waitForDiscovery waits until every discover pool's name has answered, serving the admin
// address meanwhile (/readyz 503), or until SIGINT or SIGTERM.
func waitForDiscovery(disc *discover.Set, adminAddr string, reg *prometheus.Registry, logger *slog.Logger) error {
	pending := disc.Pending()
	if len(pending) == 0 {
		return nil
	}
	logger.Info("waiting for the DNS answers of discover pools", "pools", pending)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if adminAddr != "" {
		aln, err := net.Listen("tcp", adminAddr)
		if err != nil {
			return listenError("admin", adminAddr, `another moxi? pick another with --admin, or turn it off with --admin ""`, err)
		}
		waiting := func() string {
			return "no DNS answer yet for the servers of pool " + strings.Join(disc.Pending(), ", ")
		}
		srv := admin.NewServer(admin.Starting(reg, waiting), admin.DefaultBounds, slog.NewLogLogger(logger.Handler(), slog.LevelWarn))
		go func() { _ = srv.Serve(admin.Listen(aln, admin.DefaultBounds)) }()
		defer srv.Close() // the admin server proper takes the address over
	}
	if err := disc.Wait(ctx); err != nil {
		return err
	}
	logger.Info("discover pools answered", "pools", pending)
	return nil
}

// grace is how long a server that a reload dropped stays open: the longest a request that
// started on the old topology can take.
func grace(cfg *config.Config) time.Duration {
	g := time.Duration(0)
	for _, pc := range cfg.Pools {
		g = max(g, pc.Timeout*time.Duration(pc.Retries+1)+pc.ConnectTimeout)
	}
	return g + time.Second
}

// settingStats is the running config cfg as "stats settings" lines.
func settingStats(cfg *config.Config) []protocol.Stat {
	settings, err := cfg.Settings()
	if err != nil {
		return nil
	}
	out := make([]protocol.Stat, len(settings))
	for i, s := range settings {
		out[i] = protocol.Stat{Name: s.Name, Value: s.Value}
	}
	return out
}

// The proxy starts runs without a goroutine waiting for their answers (docs/architecture.md),
// times requests as their clients see them, and says where a key goes (the request log),
// for the clients of every listener.
var (
	_ frontend.Starter = (*proxy.Proxy)(nil)
	_ frontend.Starter = proxy.Listener{}
	_ frontend.Timer   = (*proxy.Proxy)(nil)
	_ frontend.Timer   = proxy.Listener{}
	_ frontend.Locator = (*proxy.Proxy)(nil)
	_ frontend.Locator = proxy.Listener{}
)

// clientAuth is the client authentication c puts in force, nil for none.
func clientAuth(c *config.Config) *frontend.Auth {
	if c.Auth == nil {
		return nil
	}
	a := &frontend.Auth{Users: auth.NewUsers(c.Auth.Users), Namespaces: c.Auth.Namespaces}
	if len(c.Auth.Limits) > 0 {
		rates := make(map[string]limit.Rates, len(c.Auth.Limits))
		for _, u := range c.Auth.Limits {
			rates[u.User] = limit.Rates{Requests: int64(u.RequestsPerS), Bytes: int64(u.BytesPerS)}
		}
		a.Limits = limit.NewUsers(rates)
	}
	return a
}
