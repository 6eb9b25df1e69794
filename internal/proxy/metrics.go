package proxy

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

// metrics are the request path's Prometheus series, resolved per command once so that a
// request costs no label lookup.
type metrics struct {
	requests [protocol.NumOps]prometheus.Counter
	duration [protocol.NumOps]prometheus.Observer

	coalesced, hotHits, hotMisses prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, pending func() float64) *metrics {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moxi_requests_total",
		Help: "Client requests handled, by memcached command.",
	}, []string{"command"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "moxi_request_duration_seconds",
		Help:    "Time from a decoded client request to its answer, by memcached command.",
		Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	}, []string{"command"})
	m := &metrics{
		coalesced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "moxi_dedup_coalesced_total",
			Help: "Gets answered by joining an identical get already in flight instead of asking a server.",
		}),
		hotHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "moxi_hotcache_hits_total",
			Help: "Reads of hot-cache keys answered from the proxy's memory.",
		}),
		hotMisses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "moxi_hotcache_misses_total",
			Help: "Reads of hot-cache keys that had to ask a server.",
		}),
	}
	reg.MustRegister(requests, duration, m.coalesced, m.hotHits, m.hotMisses,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "moxi_fire_and_forget_pending",
			Help: "Fire-and-forget writes queued or being written.",
		}, pending))
	for op := range protocol.NumOps {
		name := protocol.Op(op).String()
		m.requests[op] = requests.WithLabelValues(name)
		m.duration[op] = duration.WithLabelValues(name)
	}
	return m
}
