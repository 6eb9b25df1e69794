package test

import (
	"sync"
	"syscall"
	"testing"
	"time"
)

// BenchmarkPausedServerP99 measures the latency of requests for healthy servers' keys, first
// with all three servers up, then while the third is paused (SIGSTOP) and other clients keep
// asking for its keys; it reports both p99s and their ratio. One run takes about 5 s, so
// `go test -bench PausedServer` runs it once.
func BenchmarkPausedServerP99(b *testing.B) {
	mcs := cluster(b, 3)
	moxi := startMoxi(b, "--config", writeConfig(b, resilientConfig(false, addrs(mcs)...)))
	bad, good := keysOf(2, 3, 50)
	measure := func(d time.Duration) []time.Duration {
		return getLatencies(b, moxi.addr, d, func(i int) string { return good[i%len(good)] })
	}
	// Clients of the third server's keys run in both phases at a steady 500 requests/s each,
	// so that the only difference is the pause (during it they get SERVER_ERROR, at once
	// once the server is marked dead; unpaced they would spin and load the machine).
	others := func() (stop func()) {
		done := make(chan struct{})
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := dialText(moxi.addr)
				if err != nil {
					return
				}
				defer c.Close()
				for i := 0; i < 1_000_000; i++ {
					select {
					case <-done:
						return
					default:
					}
					_, _ = c.get(bad[i%len(bad)])
					time.Sleep(2 * time.Millisecond)
				}
			}()
		}
		return func() { close(done); wg.Wait() }
	}
	for b.Loop() {
		stop := others()
		normal := measure(2 * time.Second)
		stop()

		if err := mcs[2].Signal(syscall.SIGSTOP); err != nil {
			b.Fatal(err)
		}
		stop = others()
		paused := measure(2 * time.Second)
		stop()
		_ = mcs[2].Signal(syscall.SIGCONT)

		b.ReportMetric(float64(p99(normal).Microseconds()), "p99-normal-µs")
		b.ReportMetric(float64(p99(paused).Microseconds()), "p99-paused-µs")
		b.ReportMetric(float64(p99(paused))/float64(p99(normal)), "p99-ratio")
		b.Logf("healthy keys: %d requests p99 %v with all up; %d requests p99 %v with one server paused", len(normal), p99(normal), len(paused), p99(paused))
	}
}
