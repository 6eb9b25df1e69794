package proxy

import (
	"github.com/prometheus/client_golang/prometheus"

	"moxi/internal/protocol"
)

// metrics are the request path's Prometheus series, resolved per command once so that a
// request costs no label lookup.
type metrics struct {
	requests [protocol.NumOps]prometheus.Counter
	duration [protocol.NumOps]prometheus.Observer
}

func newMetrics(reg prometheus.Registerer) *metrics {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moxi_requests_total",
		Help: "Client requests handled, by memcached command.",
	}, []string{"command"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "moxi_request_duration_seconds",
		Help:    "Time from a decoded client request to its answer, by memcached command.",
		Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	}, []string{"command"})
	reg.MustRegister(requests, duration)
	m := &metrics{}
	for op := range protocol.NumOps {
		name := protocol.Op(op).String()
		m.requests[op] = requests.WithLabelValues(name)
		m.duration[op] = duration.WithLabelValues(name)
	}
	return m
}
