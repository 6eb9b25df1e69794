package proxy

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/moxi-proxy/moxi/internal/backend"
	"github.com/moxi-proxy/moxi/internal/pool"
)

// ServerState is one server of the running topology, as GET /servers shows it.
type ServerState struct {
	Pool        string `json:"pool"`
	Name        string `json:"name"`
	Addr        string `json:"addr"`
	Weight      int    `json:"weight"`
	State       string `json:"state"` // "up", "dead" or "migrating"
	Connections int    `json:"connections"`
	InFlight    int64  `json:"in_flight"`
}

// counted is a server that counts its requests (a remote one).
type counted interface {
	Counters() backend.Counters
}

// Servers lists every server of the running topology with its state.
func (p *Proxy) Servers() []ServerState {
	var out []ServerState
	for _, pl := range p.Topology().Pools {
		for i := range pl.Len() {
			m := pl.Member(i)
			st := ServerState{Pool: pl.Name(), Name: m.Name, Addr: m.Addr, Weight: m.Weight, State: "up"}
			if !m.Up() {
				st.State = "dead"
			}
			if mg, ok := m.Server.(interface{ Phase() string }); ok && mg.Phase() == "copying" {
				st.State = "migrating"
			}
			if c, ok := m.Server.(counted); ok {
				n := c.Counters()
				st.Connections, st.InFlight = n.ConnectionsUp, n.InFlight
			}
			out = append(out, st)
		}
	}
	return out
}

// serverCollector exports the servers of whatever topology is running at scrape time, so
// that a reload needs no metric bookkeeping.
type serverCollector struct {
	p                    *Proxy
	up, requests, errors *prometheus.Desc
}

func newServerCollector(p *Proxy) *serverCollector {
	labels := []string{"pool", "server"}
	return &serverCollector{
		p:        p,
		up:       prometheus.NewDesc("moxi_backend_up", "1 while the server is considered alive, 0 while it is marked dead.", labels, nil),
		requests: prometheus.NewDesc("moxi_backend_requests_total", "Requests sent to the server.", labels, nil),
		errors:   prometheus.NewDesc("moxi_backend_errors_total", "Requests the server did not answer, by kind: timeout, connect, io, overload.", append(labels, "kind"), nil),
	}
}

func (c *serverCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.up
	ch <- c.requests
	ch <- c.errors
}

func (c *serverCollector) Collect(ch chan<- prometheus.Metric) {
	seen := map[*pool.Member]bool{}
	for _, pl := range c.p.Topology().Pools {
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
			s, ok := m.Server.(counted)
			if !ok {
				continue
			}
			n := s.Counters()
			ch <- prometheus.MustNewConstMetric(c.requests, prometheus.CounterValue, float64(n.Requests), pl.Name(), m.Name)
			for kind, v := range map[string]uint64{"timeout": n.Timeouts, "connect": n.Connect, "io": n.IO, "overload": n.Overload} {
				ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(v), pl.Name(), m.Name, kind)
			}
		}
	}
}
