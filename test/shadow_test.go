package test

import (
	"fmt"
	"math"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// shadowConfig is pool main over mains, shadowing fraction of its keys to pool sandbox
// over shadow (no shadow section when fraction is 0).
func shadowConfig(mains []*memcachedtest.Server, shadow string, fraction float64) string {
	s := fmt.Sprintf("pools:\n  main:\n    timeout: 2s\n    servers: [%q, %q]\n", mains[0].Addr, mains[1].Addr)
	if fraction > 0 {
		s += fmt.Sprintf("    shadow: {pool: sandbox, fraction: %g}\n", fraction)
	}
	return s + fmt.Sprintf("  sandbox:\n    timeout: 100ms\n    retries: 0\n    servers: [%q]\ndefault_pool: main\n", shadow)
}

// shadowKeysOn lists the keys a memcached holds (lru_crawler metadump all), sorted.
func shadowKeysOn(t *testing.T, addr string) []string {
	t.Helper()
	c, r := dialConn(t, addr)
	defer c.Close()
	var keys []string
	for _, line := range roundTrip(t, c, r, "lru_crawler metadump all\r\n", "END") {
		if rest, ok := strings.CutPrefix(line, "key="); ok {
			k, _, _ := strings.Cut(rest, " ")
			if u, err := url.QueryUnescape(k); err == nil {
				k = u
			}
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// shadowedKeys loads n keys through a new moxi shadowing 10 % of them to a new memcached,
// waits for the shadow queue to drain, and returns the keys the shadow pool holds.
func shadowedKeys(t *testing.T, n int) []string {
	mains, shadow := cluster(t, 2), memcachedtest.Start(t)
	admin := freeAddr(t)
	moxi := startMoxi(t, "--config", writeConfig(t, shadowConfig(mains, shadow.Addr, 0.1)), "--admin", admin)
	loadKeys(t, moxi.addr, n)
	var keys []string
	pollUntil(t, "the shadow queue drains", func() bool {
		fams := metricFamilies(t, admin)
		ok := metricSample(fams, "moxi_shadow_requests_total", "pool", "main", "result", "ok")
		keys = shadowKeysOn(t, shadow.Addr)
		return ok > 0 && int(ok) == len(keys)
	})
	fams := metricFamilies(t, admin)
	if d := metricSample(fams, "moxi_shadow_requests_total", "pool", "main", "result", "dropped"); d != 0 {
		t.Errorf("%v shadow requests dropped with a healthy shadow pool", d)
	}
	moxi.stop(t)
	return keys
}

// TestShadowKeys: at fraction 0.1 the shadow pool sees 10 % ± 1 % of the keys, and the
// same ones from another moxi process.
func TestShadowKeys(t *testing.T) {
	const n = 10000
	first := shadowedKeys(t, n)
	share := float64(len(first)) / n
	t.Logf("the shadow pool holds %d of %d keys (%.2f%%)", len(first), n, 100*share)
	if math.Abs(share-0.1) > 0.01 {
		t.Errorf("shadowed share %.4f, want 0.1 ± 0.01", share)
	}
	if second := shadowedKeys(t, n); !slices.Equal(first, second) {
		t.Errorf("a second moxi shadowed other keys: %d then %d keys", len(first), len(second))
	}
}
