package admin

import (
	"crypto/sha256"
	"encoding/hex"
	"log"
	"net"
	"net/http"
	"runtime"
	"sync"
	"time"

	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/prometheus/client_golang/prometheus"
)

// Bounds are what one admin client may hold of the process: a client that sends half a
// request, or opens connections without end, costs at most MaxConns connections for at
// most ReadHeaderTimeout each.
type Bounds struct {
	ReadHeaderTimeout time.Duration // to read a request's headers
	ReadTimeout       time.Duration // to read a whole request
	WriteTimeout      time.Duration // to write an answer: above pprof's default 30 s profile
	IdleTimeout       time.Duration // a kept-alive connection waiting for its next request
	MaxHeaderBytes    int
	MaxConns          int // connections open at once; see Listen for who makes room for whom
}

// DefaultBounds are the admin server's bounds: generous for Prometheus and probes, which
// send one small request at a time, and a few hundred KB in all however many clients come.
var DefaultBounds = Bounds{
	ReadHeaderTimeout: 5 * time.Second,
	ReadTimeout:       10 * time.Second,
	WriteTimeout:      2 * time.Minute,
	IdleTimeout:       time.Minute,
	MaxHeaderBytes:    64 << 10,
	MaxConns:          64,
}

// NewServer returns the admin HTTP server for h within b. Serve it on Listen(ln, b): its
// ConnState hook tells that listener which connections it may close to make room.
func NewServer(h http.Handler, b Bounds, errorLog *log.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: b.ReadHeaderTimeout,
		ReadTimeout:       b.ReadTimeout,
		WriteTimeout:      b.WriteTimeout,
		IdleTimeout:       b.IdleTimeout,
		MaxHeaderBytes:    b.MaxHeaderBytes,
		ErrorLog:          errorLog,
		ConnState:         trackState,
	}
}

// Listen returns ln with at most b.MaxConns connections open at once. At the cap a new
// connection takes the place of one that holds a slot without using it, so that probes and
// scrapes (/healthz, /readyz, /metrics) are answered however many connections others hold:
//
//   - first the connection idle the longest between keep-alive requests: its client loses
//     only a reconnect (net/http's Transport retries a request that meets a kept-alive
//     connection closed, as it does after IdleTimeout);
//   - else the oldest connection still sending its first request's headers: one that sent
//     half a header and stalls keeps its slot only until MaxConns newer connections came,
//     while a probe, which sends its request at once, needs its slot for one round trip.
//     (No grace period: a flood younger than any grace would lock probes out again.)
//
// A connection with a request in progress (StateActive, or hijacked) is never closed: when
// every slot holds one, the new connection is closed as accepted, so memory stays bounded.
// The states come from the ConnState hook of a server made by NewServer.
func Listen(ln net.Listener, b Bounds) net.Listener {
	if b.MaxConns <= 0 {
		return ln
	}
	return &limitListener{Listener: ln, max: b.MaxConns, conns: make(map[*trackedConn]struct{}, b.MaxConns)}
}

// limitListener is Listen's listener: it tracks the connections it handed out and, at the
// cap, closes one of them (victimLocked) or the new one.
type limitListener struct {
	net.Listener
	max int // read-only

	mu    sync.Mutex
	conns map[*trackedConn]struct{} // guarded by mu; the open connections, one slot each
	tick  uint64                    // guarded by mu; counts state changes, to order them
}

// trackedConn is a connection of a limitListener, with the state its server last reported.
type trackedConn struct {
	net.Conn
	l     *limitListener
	state http.ConnState // guarded by l.mu
	since uint64         // guarded by l.mu; l.tick when state began
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		tc := &trackedConn{Conn: c, l: l}
		l.mu.Lock()
		var victim *trackedConn
		if len(l.conns) >= l.max {
			if victim = l.victimLocked(); victim != nil {
				delete(l.conns, victim)
			}
		}
		admitted := len(l.conns) < l.max
		if admitted {
			l.conns[tc] = struct{}{}
			l.setLocked(tc, http.StateNew)
		}
		l.mu.Unlock()
		if victim != nil {
			// Its server's read fails and ends its goroutine, which closes it again (a no-op).
			victim.Close()
		}
		if admitted {
			return tc, nil
		}
		c.Close()
	}
}

// victimLocked is the connection a new one replaces at the cap (see Listen), or nil when
// every connection has a request in progress.
func (l *limitListener) victimLocked() *trackedConn {
	var idle, fresh *trackedConn
	for c := range l.conns {
		switch {
		case c.state == http.StateIdle && (idle == nil || c.since < idle.since):
			idle = c
		case c.state == http.StateNew && (fresh == nil || c.since < fresh.since):
			fresh = c
		}
	}
	if idle != nil {
		return idle
	}
	return fresh
}

func (l *limitListener) setLocked(c *trackedConn, s http.ConnState) {
	l.tick++
	c.state, c.since = s, l.tick
}

// trackState is NewServer's ConnState hook: it records each state for Listen's choice.
func trackState(c net.Conn, s http.ConnState) {
	if tc, ok := c.(*trackedConn); ok {
		tc.l.mu.Lock()
		tc.l.setLocked(tc, s)
		tc.l.mu.Unlock()
	}
}

// Close closes the connection and gives its slot back; closing it again changes nothing.
func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.l.mu.Lock()
	delete(c.l.conns, c)
	c.l.mu.Unlock()
	return err
}

// BuildInfo is moxi_build_info{version,goversion}, always 1: the labels are the point.
func BuildInfo(version string) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "moxi_build_info",
		Help:        "Always 1; labelled with moxi's version and the Go version it was built with.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version()},
	}, func() float64 { return 1 })
}

// ConfigInfo is moxi_config_info{hash}, always 1: the hash of the config in service (its
// effective form, every default written out, as GET /config serves it), so that the
// proxies of a tier that run different configurations show apart. The addresses of
// listen and admin are left out: a flag may set them per process (--listen, --admin) in
// a tier that runs one file.
func ConfigInfo(configs Reloader) prometheus.Collector {
	return &configInfo{configs: configs, desc: prometheus.NewDesc("moxi_config_info",
		"Always 1; labelled with the hash of the effective config in service (GET /config): proxies of one tier should agree.",
		[]string{"hash"}, nil)}
}

type configInfo struct {
	configs Reloader
	desc    *prometheus.Desc

	mu     sync.Mutex
	hashed *config.Config // the config whose hash is hash
	hash   string
}

func (c *configInfo) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *configInfo) Collect(ch chan<- prometheus.Metric) {
	cfg := c.configs.Config()
	c.mu.Lock()
	if cfg != c.hashed {
		c.hashed, c.hash = cfg, ConfigHash(cfg)
	}
	hash := c.hash
	c.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, 1, hash)
}

// ConfigHash is the first 16 hex digits of the SHA-256 of cfg's effective YAML, listen and
// admin left out.
func ConfigHash(cfg *config.Config) string {
	c := *cfg
	c.Listen, c.Admin = "", ""
	out, err := c.YAML()
	if err != nil {
		return "unknown"
	}
	sum := sha256.Sum256(out)
	return hex.EncodeToString(sum[:8])
}
