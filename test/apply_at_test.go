package test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestApplyAtTier: two moxi processes serve pool main over s0 and s1; a third server is
// added with apply_at 6 s ahead, the file reaching the proxies 2 s apart. Writers go
// through the proxy that gets the file first, readers through both (3 of 4 through the
// other); no read is older than a version acknowledged before it was
// sent (outside ±100 ms of apply_at), while without apply_at the proxies would place the
// moved keys differently for 2 s.
func TestApplyAtTier(t *testing.T) {
	t.Parallel() // mostly waits for instants and polls: runs beside the other such tests
	mcs := cluster(t, 3)
	conf := func(n int, at string) string {
		var b strings.Builder
		b.WriteString("watch_config: false\n")
		if at != "" {
			fmt.Fprintf(&b, "apply_at: %q\n", at)
		}
		b.WriteString("pools:\n  main:\n    timeout: 2s\n    servers:\n")
		for i := range n {
			fmt.Fprintf(&b, "      - {name: s%d, addr: %q}\n", i, mcs[i].Addr)
		}
		return b.String()
	}
	proxies := startTier(t, conf(2, ""))
	var keys []string
	for i := range 120 {
		keys = append(keys, fmt.Sprintf("add:%d", i))
	}
	at := time.Now().Add(6 * time.Second)
	after := conf(3, at.UTC().Format(time.RFC3339Nano))

	chk := newStaleCheck(keys)
	chk.around = at
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); chk.write(t, proxies[0].moxi.addr, w, 4, stop) }()
	}
	for r := range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); chk.read(t, proxies[min(r, 1)].moxi.addr, stop) }()
	}
	proxies[0].reload(t, after, "scheduled")
	<-time.After(2 * time.Second) // the tier's reloads are 2 s apart
	proxies[1].reload(t, after, "scheduled")
	// Until 2 s after apply_at, then a last look that the new server is in service.
	<-time.After(time.Until(at.Add(2 * time.Second)))
	close(stop)
	wg.Wait()
	for i := range proxies {
		if !landsOn(proxies[i].moxi.addr, mcs[2].Addr, keysOn(2, 3)) {
			t.Errorf("proxy %d does not use the added server after apply_at", i)
		}
	}
	t.Logf("%d reads, %d stale (%d more within 100 ms of apply_at), %d acknowledged writes", chk.reads.Load(), chk.stale.Load(), chk.nearStale.Load(), chk.acked.Load())
	if chk.stale.Load() > 0 {
		t.Errorf("%d stale reads outside ±100 ms of apply_at:\n%s", chk.stale.Load(), strings.Join(chk.examples(), "\n"))
	}
	if len(chk.errorsByKey()) > 0 {
		t.Errorf("errors: %v", chk.errorsByKey())
	}
}

// keysOn is a key that server s of n servers named s0… owns.
func keysOn(s, n int) string {
	mine, _ := keysOf(s, n, 1)
	return mine[0]
}
