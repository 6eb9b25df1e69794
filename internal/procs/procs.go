// Package procs sizes the Go scheduler to moxi's load: it keeps as few threads running Go
// code at once (GOMAXPROCS) as keep up, and adds one when goroutines wait to run. A proxy's
// request is mostly hand-offs — a client's reader, a server connection's reader — and
// between threads each hand-off is a wake-up; on one thread it is a function call away. On
// a small host shared with memcached and the clients, two threads cost a request 1.5× the
// CPU of one and serve fewer requests; on a host with cores to spare and the load for
// them, the added threads are what keeps up.
package procs

import (
	"context"
	"math"
	"runtime"
	"runtime/metrics"
	"syscall"
	"time"
)

// Interval is how often Run looks at the load.
const Interval = 250 * time.Millisecond

// A thread is added when the process uses more than busyToAdd of each thread it has and a
// tenth of the goroutines that became runnable waited longer than waitToAdd to run; one
// is taken away when the rest would still be used less than busyToDrop each.
const (
	busyToAdd  = 0.75
	waitToAdd  = 200 * time.Microsecond
	busyToDrop = 0.5
)

// Run adjusts GOMAXPROCS between 1 and max every Interval until ctx ends; max is what it was
// when Run began (Go's default: the CPUs the process may use, its cgroup's quota included).
// With the GOMAXPROCS environment variable set, the operator's choice stands and Run
// returns at once. changed, when not nil, is told each new count.
func Run(ctx context.Context, env func(string) string, changed func(procs int)) {
	if env("GOMAXPROCS") != "" {
		return
	}
	maxProcs := runtime.GOMAXPROCS(0)
	if maxProcs <= 1 {
		return
	}
	procs := 1
	runtime.GOMAXPROCS(procs)
	defer runtime.GOMAXPROCS(maxProcs)
	tick := time.NewTicker(Interval)
	defer tick.Stop()
	var l load
	l.read()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		busy, wait := l.read()
		if next := decide(procs, maxProcs, busy, wait); next != procs {
			procs = next
			runtime.GOMAXPROCS(procs)
			if changed != nil {
				changed(procs)
			}
		}
	}
}

// decide is the thread count after a window in which the process used busy CPUs and a
// tenth of its runnable goroutines waited longer than wait, with procs threads of max.
func decide(procs, maxProcs int, busy float64, wait time.Duration) int {
	switch {
	case procs < maxProcs && busy > busyToAdd*float64(procs) && wait > waitToAdd:
		return procs + 1
	case procs > 1 && busy < busyToDrop*float64(procs-1):
		return procs - 1
	}
	return procs
}

// load reads the process's CPU time and the runtime's scheduling latencies since the last
// read.
type load struct {
	at      time.Time
	cpu     time.Duration
	samples []metrics.Sample
	last    []uint64 // the latency histogram's counts at the last read
}

const latencies = "/sched/latencies:seconds"

// read returns the CPUs used and the 90th percentile of the wait to run since the last
// read.
func (l *load) read() (busy float64, wait time.Duration) {
	now := time.Now()
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	if l.samples == nil {
		l.samples = []metrics.Sample{{Name: latencies}}
	}
	metrics.Read(l.samples)
	var counts []uint64
	var buckets []float64
	if h := l.samples[0].Value; h.Kind() == metrics.KindFloat64Histogram {
		counts, buckets = h.Float64Histogram().Counts, h.Float64Histogram().Buckets
	}
	if !l.at.IsZero() && now.After(l.at) {
		busy = float64(cpu-l.cpu) / float64(now.Sub(l.at))
		wait = percentile(counts, l.last, buckets, 0.9)
	}
	l.at, l.cpu = now, cpu
	l.last = append(l.last[:0], counts...)
	return busy, wait
}

// percentile is the q-th quantile's upper bucket bound of the histogram's growth from
// before to counts (buckets are the bounds, one more than the counts).
func percentile(counts, before []uint64, buckets []float64, q float64) time.Duration {
	var total uint64
	for i := range counts {
		total += counts[i] - at(before, i)
	}
	if total == 0 {
		return 0
	}
	want := uint64(q * float64(total))
	var seen uint64
	for i := range counts {
		if seen += counts[i] - at(before, i); seen > want {
			return seconds(buckets[i+1], buckets[i])
		}
	}
	return seconds(buckets[len(buckets)-1], buckets[len(buckets)-2])
}

// seconds is bound as a duration, or lower when bound is the last bucket's +Inf.
func seconds(bound, lower float64) time.Duration {
	if math.IsInf(bound, 1) {
		bound = lower
	}
	return time.Duration(bound * float64(time.Second))
}

func at(s []uint64, i int) uint64 {
	if i < len(s) {
		return s[i]
	}
	return 0
}
