package test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestReplicasPauseTwoProxies: two proxies in front of three servers (replicas: 2), writers
// through A storing rising versions, readers through B; one server paused for 2 s while
// they run, then resumed. B does not know which writes the paused server missed: until A's
// cleanup of it has run, B may read an older value there (the window docs/operating.md
// states). Measured, for each write_quorum: the window (the last stale read's start after
// the resume), and whether a reader saw a key go back. Asserted: no read that starts once
// A's cleanup has run is stale (with one: more than the write in flight behind), and
// afterwards no server holds a key older than its last acknowledged write — a late write
// included (it is chased by a delete on its connection).
func TestReplicasPauseTwoProxies(t *testing.T) {
	t.Parallel() // mostly waits out the pauses: runs beside the other such tests
	for _, quorum := range []string{"all", "one"} {
		t.Run(quorum, func(t *testing.T) { pauseTwoProxies(t, quorum) })
	}
}

func pauseTwoProxies(t *testing.T, quorum string) {
	mcs := cluster(t, 3)
	cfg := strings.Replace(replicaConfig(2, addrs(mcs)...), "write_quorum: all", "write_quorum: "+quorum, 1)
	a := startMoxi(t, "--config", writeConfig(t, cfg))
	b := startMoxi(t, "--config", writeConfig(t, cfg))
	const victim = 1
	set := replicaSets(3, 2)
	keys := make([]string, 60)
	for i := range keys {
		keys[i] = fmt.Sprintf("tp:%d", i)
	}
	chk := newStaleCheck(keys)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() { chk.write(t, a.addr, w, 4, stop) })
	}
	var resumedAt, cleanedAt atomic.Int64 // unix nanoseconds, 0 before
	var reads, staleInWindow, staleAfter, wentBack atomic.Int64
	var lastStale atomic.Int64 // the last stale read's start, unix nanoseconds
	var mu sync.Mutex
	var seen []string
	for range 4 {
		wg.Go(func() {
			tc, err := dialText(b.addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer tc.Close()
			highest := map[string]int64{} // per key, the newest version this reader read
			for range maxOps {
				select {
				case <-stop:
					return
				default:
				}
				k := keys[rand.IntN(len(keys))]
				floor, sent := chk.newest[k].Load(), time.Now().UnixNano()
				v, err := tc.get(k)
				if err != nil {
					t.Error(err)
					return
				}
				reads.Add(1)
				if v == "" || isErrorLine(v) {
					continue
				}
				got := versionIn(v)
				back := got < highest[k]
				highest[k] = max(highest[k], got)
				if got >= floor && !back {
					continue
				}
				if back {
					wentBack.Add(1)
				}
				if got < floor {
					// With one, a write is answered before its other replica took it: B may
					// read the version before it meanwhile (A serialises a key's writes, so
					// never two behind). That is the quorum's, not the pause's.
					if c := cleanedAt.Load(); c != 0 && sent > c && (quorum == "all" || got < floor-1) {
						staleAfter.Add(1)
					} else {
						staleInWindow.Add(1)
						lastStale.Store(sent)
					}
				}
				mu.Lock()
				if len(seen) < 10 {
					seen = append(seen, fmt.Sprintf("%s read %d (newest acknowledged %d, this reader's newest %d), %v after the resume",
						k, got, floor, highest[k], time.Duration(sent-resumedAt.Load())))
				}
				mu.Unlock()
			}
		})
	}
	var stopped sync.Once
	halt := func() { stopped.Do(func() { close(stop) }); wg.Wait() }
	t.Cleanup(halt)

	waitUntil(t, time.Now(), 30*time.Second, func() bool { return chk.acked.Load() >= 300 && reads.Load() >= 300 })
	mcs[victim].Pause(t)
	paused, acked := time.Now(), chk.acked.Load()
	waitUntil(t, paused, 30*time.Second, func() bool {
		return time.Since(paused) >= 2*time.Second && chk.acked.Load() >= acked+300
	})
	if err := mcs[victim].Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumedAt.Store(time.Now().UnixNano())
	// A's cleanup of the victim has run once A reports it up and owing nothing.
	stats, err := dialText(a.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer stats.Close()
	cleaned := waitUntil(t, time.Now(), 30*time.Second, func() bool {
		lines := roundTrip(t, stats.c, stats.r, "stats proxy\r\n", "END")
		name := fmt.Sprintf("STAT main:s%d:", victim)
		return slices.Contains(lines, name+"state up") && slices.Contains(lines, name+"away 0")
	})
	cleanedAt.Store(time.Now().UnixNano())
	r0, acked := reads.Load(), chk.acked.Load()
	waitUntil(t, time.Now(), 30*time.Second, func() bool { return reads.Load() >= r0+1000 && chk.acked.Load() >= acked+300 })
	halt()

	window := time.Duration(0)
	if l := lastStale.Load(); l != 0 {
		window = time.Duration(l - resumedAt.Load())
	}
	t.Logf("write_quorum %s: %d reads through B; A's cleanup of s%d ran within %v of the resume; %d stale reads before it (the last started %v after the resume), %d after; %d reads went back",
		quorum, reads.Load(), victim, cleaned.Round(time.Millisecond), staleInWindow.Load(), window.Round(time.Millisecond), staleAfter.Load(), wentBack.Load())
	if len(seen) > 0 {
		t.Logf("first stale or backward reads:\n%s", strings.Join(seen, "\n"))
	}
	if n := staleAfter.Load(); n > 0 {
		t.Errorf("%d reads through B that started after A's cleanup were older than acknowledged; want 0", n)
	}
	// Every copy, read directly: none older than the last acknowledged write.
	for s, mc := range mcs {
		held := replicaValues(t, mc.Addr, keys)
		for _, k := range keys {
			if v, ok := held[k]; ok && versionIn(v) < chk.newest[k].Load() {
				t.Errorf("s%d holds %s = %s, older than its last acknowledged write %d (replicas %v)", s, k, v, chk.newest[k].Load(), set(k))
			}
		}
	}
	if t.Failed() {
		t.Logf("A's log:\n%s\nB's log:\n%s", tail(a.out.String(), 4<<10), tail(b.out.String(), 4<<10))
	}
}
