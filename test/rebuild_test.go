package test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// rebuildRun fills keys through moxi (replicas: 2, three servers), restarts one server
// empty, and waits for its rebuild: every key then on both its replicas, read directly.
// bin is the moxi binary. With live, 8 clients read the keys in a closed loop for 2 s
// before the restart and throughout the rebuild. It returns the rebuild's entry, its copy
// rate and, with live, the reads' p99 before and during the rebuild.
func rebuildRun(t testing.TB, bin string, keys int, live bool) (entry migrationJSON, rate float64, before, during time.Duration) {
	mcs := cluster(t, 3)
	born := time.Now()
	admin := freeAddr(t)
	moxi := startMoxiBin(t, bin, "--config", writeConfig(t, replicaConfig(2, addrs(mcs)...)), "--admin", admin)
	fill(t, moxi.addr, "rb:", keys, 32)
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("rb:%d", i)
	}
	const victim = 1
	key := func(i int) string { return names[i%keys] }
	if live {
		before = p99(getLatencies(t, moxi.addr, 2*time.Second, key))
	}
	// memcached tells its start instant in whole seconds: a restart is seen as one once
	// the two processes' instants are two seconds apart.
	poll(30*time.Second, func() bool { return time.Since(born) > 2500*time.Millisecond })
	mcs[victim].Restart(t)
	stop := make(chan struct{})
	var lat []time.Duration
	var reading sync.WaitGroup
	if live {
		reading.Go(func() { lat = timedGets(t, moxi.addr, 0, stop, key) })
	}
	done := poll(120*time.Second, func() bool {
		for _, m := range migrations(t, admin) {
			if m.Name == "rebuild-1" && m.Phase == "failed" {
				t.Fatalf("rebuild-1 failed: %+v", m)
			}
			if m.Name == "rebuild-1" && m.Phase == "done" {
				entry = m
				return true
			}
		}
		return false
	})
	close(stop)
	reading.Wait()
	if !done {
		t.Fatalf("rebuild-1 not done within 120 s: %+v", migrations(t, admin))
	}
	if live {
		during = p99(lat)
	}
	started, err1 := time.Parse(time.RFC3339Nano, entry.Started)
	finished, err2 := time.Parse(time.RFC3339Nano, entry.Finished)
	if err1 != nil || err2 != nil {
		t.Fatalf("rebuild-1's times: %+v", entry)
	}
	rate = float64(entry.KeysCopied) / finished.Sub(started).Seconds()

	set := replicaSets(3, 2)
	missing := 0
	held := make([]map[string]string, len(mcs))
	for s, mc := range mcs {
		held[s] = replicaValues(t, mc.Addr, names)
	}
	onVictim := 0
	for _, k := range names {
		for _, s := range set(k) {
			if s == victim {
				onVictim++
			}
			if _, ok := held[s][k]; !ok {
				if missing++; missing <= 5 {
					t.Errorf("%s is missing on its replica s%d (replicas %v)", k, s, set(k))
				}
			}
		}
	}
	if missing > 0 {
		t.Errorf("%d copies missing after the rebuild", missing)
	}
	// Reads repair some keys first under a live load: the rebuild's add then stores nothing.
	if copied := entry.KeysCopied; copied > int64(onVictim) || (!live && copied != int64(onVictim)) || !strings.Contains(entry.To, mcs[victim].Addr) {
		t.Errorf("rebuild-1 %+v; want %d keys copied to %s", entry, onVictim, mcs[victim].Addr)
	}
	if t.Failed() {
		t.Logf("moxi log:\n%s", tail(moxi.out.String(), 8<<10))
	}
	return entry, rate, before, during
}

// TestReplicasRebuild: a server of a replicated pool restarted empty is refilled from the
// other replicas in the background, without a read: /migrations lists rebuild-1 until it is
// done, and then every key is on both its replicas.
func TestReplicasRebuild(t *testing.T) {
	entry, rate, _, _ := rebuildRun(t, moxiBin, 20_000, false)
	t.Logf("rebuild-1: %d keys copied of %d listed, %.0f keys/s", entry.KeysCopied, entry.KeysTotal, rate)
}

// BenchmarkRebuild is the rebuild's figures: 100,000 keys on three servers, one restarted
// empty. idle: no client load, keys/s is the copy's rate. live: 8 clients read the keys in
// a closed loop, before the restart and throughout the rebuild; p99-ratio is their p99
// during the rebuild over before (BenchmarkReshardFloor/list is the floor: memcached
// listing its keys under the same load).
func BenchmarkRebuild(b *testing.B) {
	for _, live := range []bool{false, true} {
		name := "idle"
		if live {
			name = "live"
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				entry, rate, before, during := rebuildRun(b, fastMoxi(b), 100_000, live)
				b.ReportMetric(rate, "keys/s")
				b.ReportMetric(float64(entry.KeysCopied), "keys")
				if live {
					b.ReportMetric(float64(before.Microseconds()), "p99-before-µs")
					b.ReportMetric(float64(during.Microseconds()), "p99-rebuilding-µs")
					b.ReportMetric(float64(during)/float64(before), "p99-ratio")
				}
			}
		})
	}
}
