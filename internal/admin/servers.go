package admin

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/topology"
)

// ServerState is one server of the running topology, as GET /servers shows it.
type ServerState struct {
	Pool        string     `json:"pool"`
	Name        string     `json:"name"`
	Addr        string     `json:"addr"`
	Weight      int        `json:"weight"`
	State       pool.State `json:"state"`            // "up", "dead" or "migrating"
	Reason      string     `json:"reason,omitempty"` // why it is dead: what marked it so, then the last probe's failure
	Connections int        `json:"connections"`
	InFlight    int64      `json:"in_flight"`
}

// Servers lists every server of t with its state.
func Servers(t *topology.Topology) []ServerState {
	var out []ServerState
	for _, pl := range t.Pools {
		for i := range pl.Len() {
			m := pl.Member(i)
			info := m.Server.Info()
			out = append(out, ServerState{
				Pool: pl.Name(), Name: m.Name, Addr: m.Addr, Weight: m.Weight, State: info.State, Reason: info.Reason,
				Connections: info.Counters.ConnectionsUp, InFlight: info.Counters.InFlight,
			})
		}
	}
	return out
}

// ServerCollector exports the servers of whatever topology is running at scrape time, so
// that a reload needs no metric bookkeeping: each server's series (metrics.per_server), or
// each pool's, which sum its servers' counters and are up while one of them is.
type ServerCollector struct {
	src                  Topologies
	perServer            bool
	up, requests, errors *prometheus.Desc
}

// NewServerCollector returns the collector of the servers of src's topology, labelled pool
// and server when perServer is set, else pool alone.
func NewServerCollector(src Topologies, perServer bool) *ServerCollector {
	labels := []string{"pool", "server"}
	if !perServer {
		labels = labels[:1]
	}
	return &ServerCollector{
		src:       src,
		perServer: perServer,
		up:        prometheus.NewDesc("moxi_backend_up", "1 while the server is considered alive (per pool: one of its servers), 0 while it is marked dead.", labels, nil),
		requests:  prometheus.NewDesc("moxi_backend_requests_total", "Requests sent to the server.", labels, nil),
		errors:    prometheus.NewDesc("moxi_backend_errors_total", "Requests the server did not answer, by kind: timeout, connect, io, overload.", append(labels, "kind"), nil),
	}
}

func (c *ServerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.up
	ch <- c.requests
	ch <- c.errors
}

// backendCounts are what one server, or one pool's servers together, export.
type backendCounts struct {
	up                                        bool
	requests, timeouts, connect, io, overload uint64
}

func (n *backendCounts) add(m *pool.Member) {
	c := m.Server.Info().Counters
	n.up = n.up || m.Up()
	n.requests += c.Requests
	n.timeouts += c.Timeouts
	n.connect += c.Connect
	n.io += c.IO
	n.overload += c.Overload
}

// Collect exports each server once, or each pool once, however many of the topology's
// tables list it.
func (c *ServerCollector) Collect(ch chan<- prometheus.Metric) {
	seen := map[*pool.Member]bool{}
	seenPools := map[string]bool{}
	for _, pl := range c.src.Topology().Pools {
		if !c.perServer {
			if seenPools[pl.Name()] {
				continue
			}
			seenPools[pl.Name()] = true
			var total backendCounts
			for i := range pl.Len() {
				total.add(pl.Member(i))
			}
			c.export(ch, &total, pl.Name())
			continue
		}
		for i := range pl.Len() {
			m := pl.Member(i)
			if seen[m] {
				continue
			}
			seen[m] = true
			var one backendCounts
			one.add(m)
			c.export(ch, &one, pl.Name(), m.Name)
		}
	}
}

func (c *ServerCollector) export(ch chan<- prometheus.Metric, n *backendCounts, labels ...string) {
	up := 0.0
	if n.up {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up, labels...)
	ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(n.requests), labels...)
	for kind, v := range map[string]uint64{"timeout": n.timeouts, "connect": n.connect, "io": n.io, "overload": n.overload} {
		if v > 0 { // a kind's series exists once it happened: most servers never fail
			ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(v), append(labels[:len(labels):len(labels)], kind)...)
		}
	}
}
