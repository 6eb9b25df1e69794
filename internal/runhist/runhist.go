// Package runhist is a Prometheus histogram vector that counts a run of observations of
// one value in one step (Series.Observe(v, n)): the requests of a pipelined run all take
// the run's time, and client_golang's histogram would take a call, a bucket search and
// three atomic additions for each of them. Its exposition is client_golang's.
package runhist

import (
	"math"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Vec is a histogram with labels, a Series per set of label values. Safe for concurrent
// use.
type Vec struct {
	desc  *prometheus.Desc
	upper []float64 // the buckets' upper bounds, ascending, +Inf's left out

	mu     sync.Mutex
	series map[string]*Series // by label values, joined; guarded by mu
}

// New is a Vec of opts' name, help and buckets (prometheus.DefBuckets when none), with the
// labels named.
func New(opts prometheus.HistogramOpts, labels []string) *Vec {
	upper := opts.Buckets
	if len(upper) == 0 {
		upper = prometheus.DefBuckets
	}
	upper = append([]float64(nil), upper...)
	sort.Float64s(upper)
	if n := len(upper); n > 0 && math.IsInf(upper[n-1], 1) {
		upper = upper[:n-1]
	}
	return &Vec{
		desc:   prometheus.NewDesc(opts.Name, opts.Help, labels, opts.ConstLabels),
		upper:  upper,
		series: map[string]*Series{},
	}
}

// With is the series of the label values given, created at its first use.
func (v *Vec) With(values ...string) *Series {
	key := strings.Join(values, "\xff")
	v.mu.Lock()
	defer v.mu.Unlock()
	s := v.series[key]
	if s == nil {
		s = &Series{values: append([]string(nil), values...), upper: v.upper, counts: make([]atomic.Uint64, len(v.upper)+1)}
		v.series[key] = s
	}
	return s
}

// Series is one set of label values' histogram.
type Series struct {
	values []string
	upper  []float64
	counts []atomic.Uint64 // by bucket, not cumulative; the last is +Inf's
	sum    atomic.Uint64   // math.Float64bits of the observations' sum
}

// Observe counts n observations of value.
func (s *Series) Observe(value float64, n int) {
	if n <= 0 || math.IsNaN(value) {
		return
	}
	s.counts[sort.SearchFloat64s(s.upper, value)].Add(uint64(n)) // the first bound ≥ value: "le"
	add := value * float64(n)
	for {
		old := s.sum.Load()
		if s.sum.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+add)) {
			return
		}
	}
}

// Describe is prometheus.Collector's.
func (v *Vec) Describe(ch chan<- *prometheus.Desc) { ch <- v.desc }

// Collect is prometheus.Collector's. A series' count is the sum of its buckets, so that the
// two agree however observations and a scrape interleave.
func (v *Vec) Collect(ch chan<- prometheus.Metric) {
	v.mu.Lock()
	all := make([]*Series, 0, len(v.series))
	for _, s := range v.series {
		all = append(all, s)
	}
	v.mu.Unlock()
	for _, s := range all {
		buckets := make(map[float64]uint64, len(s.upper))
		var count uint64
		for i, bound := range s.upper {
			count += s.counts[i].Load()
			buckets[bound] = count
		}
		count += s.counts[len(s.upper)].Load()
		ch <- prometheus.MustNewConstHistogram(v.desc, count, math.Float64frombits(s.sum.Load()), buckets, s.values...)
	}
}
