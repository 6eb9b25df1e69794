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
	getHits, getMisses            prometheus.Counter
	errorAnswers                  [numErrorKinds]prometheus.Counter
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

// answered counts the hits and misses of a retrieval (get, gets, gat, gats, mg: one per
// key) and the error answers among resps; errors to a noreply request are not sent, so
// not counted.
func (m *metrics) answered(req *protocol.Request, resps []protocol.Response) {
	retrieval := req.Op.IsRetrieval() || req.Op == protocol.OpMetaGet
	var hits, misses float64
	for i := range resps {
		switch s := resps[i].Status; {
		case retrieval && s == protocol.StatusOK:
			hits++
		case retrieval && s == protocol.StatusNotFound:
			misses++
		case !req.NoReply:
			if k := errorKind(s); k != noError {
				m.errorAnswers[k].Inc()
			}
		}
	}
	if hits > 0 {
		m.getHits.Add(hits)
	}
	if misses > 0 {
		m.getMisses.Add(misses)
	}
}

// rejected counts the answer to a request the decoder rejected.
func (m *metrics) rejected(s protocol.Status) {
	if k := errorKind(s); k != noError {
		m.errorAnswers[k].Inc()
	}
}

func newMetrics(reg prometheus.Registerer, buckets []float64, pending func() float64) *metrics {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moxi_requests_total",
		Help: "Client requests handled, by memcached command.",
	}, []string{"command"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "moxi_request_duration_seconds",
		Help:    "Time from a decoded client request to its answer, by memcached command.",
		Buckets: buckets,
	}, []string{"command"})
	errorAnswers := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moxi_error_answers_total",
		Help: "Error answers sent to clients, by kind: server_error (SERVER_ERROR; binary 0x0086, 0x0082, 0x0003), client_error (CLIENT_ERROR; binary 0x0004, 0x0006, 0x0020), error (ERROR; binary 0x0081).",
	}, []string{"kind"})
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
		getHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "moxi_get_hits_total",
			Help: "Keys read with a value, every protocol: get, gets, gat, gats (text and binary) and mg.",
		}),
		getMisses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "moxi_get_misses_total",
			Help: "Keys read and not found, every protocol: get, gets, gat, gats (text and binary) and mg.",
		}),
	}
	reg.MustRegister(requests, duration, errorAnswers, m.coalesced, m.hotHits, m.hotMisses, m.getHits, m.getMisses,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "moxi_fire_and_forget_pending",
			Help: "Fire-and-forget writes queued or being written.",
		}, pending))
	for k, name := range errorKindNames {
		m.errorAnswers[k] = errorAnswers.WithLabelValues(name)
	}
	for op := range protocol.NumOps {
		name := protocol.Op(op).String()
		m.requests[op] = requests.WithLabelValues(name)
		m.duration[op] = duration.WithLabelValues(name)
	}
	return m
}
