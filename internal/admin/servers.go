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
// that a reload needs no metric bookkeeping.
type ServerCollector struct {
	src                  Topologies
	up, requests, errors *prometheus.Desc
}

// NewServerCollector returns the collector of the servers of src's topology.
func NewServerCollector(src Topologies) *ServerCollector {
	labels := []string{"pool", "server"}
	return &ServerCollector{
		src:      src,
		up:       prometheus.NewDesc("moxi_backend_up", "1 while the server is considered alive, 0 while it is marked dead.", labels, nil),
		requests: prometheus.NewDesc("moxi_backend_requests_total", "Requests sent to the server.", labels, nil),
		errors:   prometheus.NewDesc("moxi_backend_errors_total", "Requests the server did not answer, by kind: timeout, connect, io, overload.", append(labels, "kind"), nil),
	}
}

func (c *ServerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.up
	ch <- c.requests
	ch <- c.errors
}

func (c *ServerCollector) Collect(ch chan<- prometheus.Metric) {
	seen := map[*pool.Member]bool{}
	for _, pl := range c.src.Topology().Pools {
		for i := range pl.Len() {
			m := pl.Member(i)
			if seen[m] {
				continue
			}
			seen[m] = true
			up := 0.0
			if m.Up() {
				up = 1
			}
			ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up, pl.Name(), m.Name)
			n := m.Server.Info().Counters
			ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(n.Requests), pl.Name(), m.Name)
			for kind, v := range map[string]uint64{"timeout": n.Timeouts, "connect": n.Connect, "io": n.IO, "overload": n.Overload} {
				ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(v), pl.Name(), m.Name, kind)
			}
		}
	}
}
