package test

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// getLatencies runs 8 clients that get key(i) for i = 0, 1, … through addr for d (and at
// most a million gets each), each as fast as its answers come, and returns every get's
// latency, sorted.
func getLatencies(b testing.TB, addr string, d time.Duration, key func(i int) string) []time.Duration {
	stop := make(chan struct{})
	t := time.AfterFunc(d, func() { close(stop) })
	defer t.Stop()
	return timedGets(b, addr, 0, stop, key)
}

// timedGets is getLatencies until stop is closed, paced by every: each
// client sends a get every 8×every (0: as soon as the last is answered), so that 8 clients
// send 1/every gets a second, a load that leaves the host room (a closed loop takes all of
// it, and then its latency is only the share of the CPU the proxy gets).
func timedGets(b testing.TB, addr string, every time.Duration, stop <-chan struct{}, key func(i int) string) []time.Duration {
	var mu sync.Mutex
	var lat []time.Duration
	withClients(b, addr, 8, func(w int, c *textClient) {
		var tick <-chan time.Time
		if every > 0 {
			t := time.NewTicker(8 * every)
			defer t.Stop()
			tick = t.C
		}
		for i := w; i < 8_000_000; i += 8 {
			if tick == nil {
				select {
				case <-stop:
					return
				default:
				}
			} else {
				select {
				case <-stop:
					return
				case <-tick:
				}
			}
			start := time.Now()
			if _, err := c.get(key(i)); err != nil {
				b.Error(err)
				return
			}
			mu.Lock()
			lat = append(lat, time.Since(start))
			mu.Unlock()
		}
	})
	slices.Sort(lat)
	return lat
}

// p99 of sorted latencies.
func p99(lat []time.Duration) time.Duration { return lat[len(lat)*99/100] }
