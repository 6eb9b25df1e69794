package test

import (
	"fmt"
	"testing"
)

// TestAllocationsPerRequest: moxi's steady path allocates nothing per request but a hit's
// value (read from the server, handed to the client connection). Measured end to end with
// the Go runtime's own count, go_memstats_mallocs_total, over 24,000 requests of clients
// that wait for each answer (sets, gets that hit, gets that miss), so that a per-request
// allocation anywhere (decoding, dedup, the backend's reads, the answer) shows.
func TestAllocationsPerRequest(t *testing.T) {
	mains := cluster(t, 2)
	admin := freeAddr(t)
	cfg := fmt.Sprintf("pools:\n  main:\n    servers: [%q, %q]\ndefault_pool: main\n", mains[0].Addr, mains[1].Addr)
	// Without the race detector, whose instrumentation allocates and whose sync.Pool drops
	// what it is given at random.
	moxi := startMoxiBin(t, fastMoxi(t), "--config", writeConfig(t, cfg), "--admin", admin)

	const clients, perClient = 4, 6000 // per client, by fours: a set, a get that hits, a get that misses, a get that hits
	load := func(n int) {
		withClients(t, moxi.addr, clients, func(w int, tc *textClient) {
			for i := range n {
				k := fmt.Sprintf("alloc:%d:%d", w, i/4%100) // set, then read: a hit, a miss, a hit
				var ans string
				var err error
				switch i % 4 {
				case 0:
					ans, err = tc.set(k, "a-value-of-some-thirty-bytes..")
				case 2:
					ans, err = tc.get(k + ":missing")
					if ans != "" {
						err = fmt.Errorf("get of a missing key: %q", ans)
					}
				default:
					ans, err = tc.get(k)
					if ans == "" || ans[0] != 'a' {
						err = fmt.Errorf("get of %s: %q", k, ans)
					}
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	load(400) // connections, pools and buffers warm
	mallocs := func() float64 { return metricSample(metricFamilies(t, admin), "go_memstats_mallocs_total") }
	// A scrape allocates too: two in a row measure what one costs, taken off below.
	first := mallocs()
	before := mallocs()
	load(perClient)
	after := mallocs()
	requests := float64(clients * perClient)
	hits := requests / 2
	perRequest := (after - before - (before - first)) / requests
	t.Logf("%.0f allocations for %.0f requests (%.0f hits), a scrape's %.0f taken off: %.2f per request",
		after-before, requests, hits, before-first, perRequest)
	// A hit's value is one allocation. One more per request would add 1 to this, per get
	// 0.75, per hit 0.5; the margin is for what the process does meanwhile (timers, pools
	// emptied by a GC, the clients' connections), measured at 0.1 to 0.2.
	if limit := hits/requests + 0.35; perRequest > limit {
		t.Errorf("%.2f allocations per request, want at most %.2f (one per hit)", perRequest, limit)
	}
}
