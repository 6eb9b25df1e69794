package proxy

import (
	"maps"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/runhist"
)

// metrics are the request path's Prometheus series. A series labelled by command, or by
// pool, is created when first used, so that a proxy exports what its clients ask and not
// every command of every protocol; once created it is resolved without a label lookup.
type metrics struct {
	requests, getHits, getMisses, errorAnswers *prometheus.CounterVec
	duration                                   *runhist.Vec // a run's requests counted in one step
	durations                                  [protocol.NumOps]lazy[*runhist.Series]
	poolDuration                               *runhist.Vec

	mu    sync.Mutex                              // held to add a pool to pools
	pools atomic.Pointer[map[string]*poolMetrics] // copied on write: read without a lock

	coalesced, hotHits, hotMisses prometheus.Counter
	invalidations                 [2]prometheus.Counter // moxi_hotcache_invalidations_total by source
}

// The sources of moxi_hotcache_invalidations_total.
const (
	invalidatedLocally = iota // a write through this proxy of a key its hot cache holds
	invalidatedByPeer         // a line of POST /invalidate
)

// poolMetrics are the series of one pool ("" for requests of none: version, stats,
// flush_all, and requests the decoder rejected).
type poolMetrics struct {
	requests           [protocol.NumOps]lazy[prometheus.Counter]
	getHits, getMisses lazy[prometheus.Counter]
	errorAnswers       [numErrorKinds]lazy[prometheus.Counter]
	duration           lazy[*runhist.Series]
	name               string
	m                  *metrics
}

// lazy is a series created at its first use. Two first uses at once both create it, which
// is harmless: a vector gives the same series for the same labels.
type lazy[T any] struct{ p atomic.Pointer[T] }

func (l *lazy[T]) get(create func() T) T {
	if p := l.p.Load(); p != nil {
		return *p
	}
	v := create()
	l.p.Store(&v)
	return v
}

// pool is the series of the pool named name.
func (m *metrics) pool(name string) *poolMetrics {
	if pm := (*m.pools.Load())[name]; pm != nil {
		return pm
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old := *m.pools.Load()
	if pm := old[name]; pm != nil {
		return pm
	}
	next := make(map[string]*poolMetrics, len(old)+1)
	maps.Copy(next, old)
	pm := &poolMetrics{name: name, m: m}
	next[name] = pm
	m.pools.Store(&next)
	return pm
}

// answered counts n requests of pm's pool answered in seconds (from decoding to answer).
func (m *metrics) answered(pm *poolMetrics, n int, seconds float64) {
	if pm.name != "" {
		pm.duration.get(func() *runhist.Series { return m.poolDuration.With(pm.name) }).Observe(seconds, n)
	}
}

// errorCounter is pm's series of error answers of kind.
func (pm *poolMetrics) errorCounter(kind int) prometheus.Counter {
	return pm.errorAnswers[kind].get(func() prometheus.Counter {
		return pm.m.errorAnswers.WithLabelValues(pm.name, errorKindNames[kind])
	})
}

// The kinds of moxi_error_answers_total, named by the word that starts the answer's text
// form, whichever protocol the client speaks (binary: the status in brackets).
const (
	serverError  = iota // SERVER_ERROR: no server answered (0x0086), out of memory (0x0082), too large (0x0003)
	clientError         // CLIENT_ERROR: a malformed request (0x0004), not a number (0x0006), a refused flush_all (0x0020)
	unknownError        // ERROR: an unknown command (0x0081)
	numErrorKinds
	noError = -1
)

var errorKindNames = [numErrorKinds]string{serverError: "server_error", clientError: "client_error", unknownError: "error"}

// errorKind is the kind of error answer s is, or noError for an outcome (a hit, a miss,
// EXISTS, NOT_STORED).
func errorKind(s protocol.Status) int {
	switch s {
	case protocol.StatusTempFailure, protocol.StatusNoMemory, protocol.StatusTooLarge:
		return serverError
	case protocol.StatusInvalid, protocol.StatusNonNumeric, protocol.StatusAuthError:
		return clientError
	case protocol.StatusUnknownCommand:
		return unknownError
	}
	return noError
}

// add adds what n counted of pm's pool's requests, but for their time (answered).
func (pm *poolMetrics) add(n *tally) {
	for op, v := range n.requests {
		if v != 0 {
			pm.requests[op].get(func() prometheus.Counter {
				return pm.m.requests.WithLabelValues(pm.name, protocol.Op(op).String())
			}).Add(float64(v))
		}
	}
	for kind, v := range n.errors {
		if v != 0 {
			pm.errorCounter(kind).Add(float64(v))
		}
	}
	if v := n.counters[getHits]; v != 0 {
		pm.getHits.get(func() prometheus.Counter { return pm.m.getHits.WithLabelValues(pm.name) }).Add(float64(v))
	}
	if v := n.counters[getMisses]; v != 0 {
		pm.getMisses.get(func() prometheus.Counter { return pm.m.getMisses.WithLabelValues(pm.name) }).Add(float64(v))
	}
}

// rejected counts the answer to a request the decoder rejected, of no pool.
func (m *metrics) rejected(s protocol.Status) {
	if k := errorKind(s); k != noError {
		m.pool("").errorCounter(k).Inc()
	}
}

func newMetrics(reg prometheus.Registerer, buckets []float64, pending func() float64) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "moxi_requests_total",
			Help: "Client requests handled, by pool (empty for commands of none) and memcached command.",
		}, []string{"pool", "command"}),
		duration: runhist.New(prometheus.HistogramOpts{
			Name:    "moxi_request_duration_seconds",
			Help:    "Time from a client request's first byte read to its answer's last byte written, by memcached command (the request log's micros).",
			Buckets: buckets,
		}, []string{"command"}),
		poolDuration: runhist.New(prometheus.HistogramOpts{
			Name:    "moxi_pool_request_duration_seconds",
			Help:    "Time from a decoded client request to its answer, by pool: how slow a pool is as its clients see it, beside moxi_backend_request_duration_seconds (its servers').",
			Buckets: buckets,
		}, []string{"pool"}),
		errorAnswers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "moxi_error_answers_total",
			Help: "Error answers sent to clients, by pool and kind: server_error (SERVER_ERROR; binary 0x0086, 0x0082, 0x0003), client_error (CLIENT_ERROR; binary 0x0004, 0x0006, 0x0020), error (ERROR; binary 0x0081).",
		}, []string{"pool", "kind"}),
		getHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "moxi_get_hits_total",
			Help: "Keys read with a value, by pool, every protocol: get, gets, gat, gats (text and binary) and mg.",
		}, []string{"pool"}),
		getMisses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "moxi_get_misses_total",
			Help: "Keys read and not found, by pool, every protocol: get, gets, gat, gats (text and binary) and mg.",
		}, []string{"pool"}),
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
	inv := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moxi_hotcache_invalidations_total",
		Help: "Hot cache keys dropped by a write, by source: local (a write through this proxy; with hot_cache.peers it is sent on), peer (a line of POST /invalidate: a write through another moxi).",
	}, []string{"source"})
	m.invalidations = [2]prometheus.Counter{invalidatedLocally: inv.WithLabelValues("local"), invalidatedByPeer: inv.WithLabelValues("peer")}
	m.pools.Store(&map[string]*poolMetrics{})
	reg.MustRegister(inv)
	reg.MustRegister(m.requests, m.duration, m.poolDuration, m.errorAnswers, m.getHits, m.getMisses, m.coalesced, m.hotHits, m.hotMisses,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "moxi_fire_and_forget_pending",
			Help: "Fire-and-forget writes queued or being written.",
		}, pending))
	return m
}

// took counts n client requests of op that took seconds as their client saw them
// (Proxy.Took).
func (m *metrics) took(op protocol.Op, n int, seconds float64) {
	m.durations[op].get(func() *runhist.Series { return m.duration.With(op.String()) }).Observe(seconds, n)
}
