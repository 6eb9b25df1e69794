package admin

import (
	"log"
	"net"
	"net/http"
	"runtime"
	"sync"
	"time"

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
	MaxConns          int // connections open at once; further ones are closed as accepted
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

// NewServer returns the admin HTTP server for h within b. Serve it on Listen(ln, b), so
// that MaxConns holds.
func NewServer(h http.Handler, b Bounds, errorLog *log.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: b.ReadHeaderTimeout,
		ReadTimeout:       b.ReadTimeout,
		WriteTimeout:      b.WriteTimeout,
		IdleTimeout:       b.IdleTimeout,
		MaxHeaderBytes:    b.MaxHeaderBytes,
		ErrorLog:          errorLog,
	}
}

// Listen returns ln with at most b.MaxConns connections open at once. A connection past
// that is closed as soon as it is accepted rather than left waiting in the kernel's
// queue: a flood is shed at once, and a scraper that meets it fails fast and tries again
// at its next scrape instead of waiting behind it.
func Listen(ln net.Listener, b Bounds) net.Listener {
	if b.MaxConns <= 0 {
		return ln
	}
	return &limitListener{Listener: ln, slots: make(chan struct{}, b.MaxConns)}
}

// limitListener is net/http's netutil.LimitListener, except that it sheds connections
// over the limit instead of blocking Accept.
type limitListener struct {
	net.Listener
	slots chan struct{} // one token per open connection
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &limitConn{Conn: c, release: func() { <-l.slots }}, nil
		default:
			c.Close()
		}
	}
}

// limitConn gives its slot back once, at its first Close.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
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
