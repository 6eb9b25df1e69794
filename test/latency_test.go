package test

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// getLatencies runs 8 clients that get key(i) for i = 0, 1, … through addr for d (and at
// most a million gets each), and returns every get's latency, sorted.
func getLatencies(b testing.TB, addr string, d time.Duration, key func(i int) string) []time.Duration {
	var mu sync.Mutex
	var lat []time.Duration
	withClients(b, addr, 8, func(w int, c *textClient) {
		end := time.Now().Add(d)
		for i := w; i < 8_000_000 && time.Now().Before(end); i += 8 {
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
