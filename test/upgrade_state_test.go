package test

import (
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/dnstest"
	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// probeCounter is a server that accepts connections and closes them at once: a dead
// memcached whose probes it counts.
type probeCounter struct {
	ln net.Listener
	mu sync.Mutex
	at []time.Time
}

func startProbeCounter(t *testing.T) *probeCounter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &probeCounter{ln: ln}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.at = append(p.at, time.Now())
			p.mu.Unlock()
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return p
}

// count is how many connections came, and between how many came from from to to.
func (p *probeCounter) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.at)
}

// lastGap is the time between the last two connections (0 before two).
func (p *probeCounter) lastGap() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.at); n >= 2 {
		return p.at[n-1].Sub(p.at[n-2])
	}
	return 0
}

func (p *probeCounter) between(from, to time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, at := range p.at {
		if !at.Before(from) && at.Before(to) {
			n++
		}
	}
	return n
}

// TestUpgradeHandsOverMemory: what one moxi learned survives an upgrade in place, in the
// successor from its first moment:
//
//   - a reshard under way (pool main going from 2 servers to 3, its copy slowed by
//     migrate_rate): the successor lists the same reshard-1, and every key written before
//     reads its value (the moved ones from their old server), then the copy ends;
//   - a hot key: /hotkeys lists it before the successor saw any request;
//   - a dead server whose probes backed off to seconds: the successor probes it at that
//     pace, not again from dead_backoff;
//   - a discovered server missing from the DNS answers: kept until remove_after counted
//     from when it went missing, not from the upgrade.
//
// Without the handover each of these fails: the successor would start with no reshard (the
// moved keys miss), no hot key, a fresh backoff and DNS's list of the moment.
func TestUpgradeHandsOverMemory(t *testing.T) {
	t.Parallel() // mostly waits for instants and polls
	const removeAfter = 10 * time.Second
	a, b := upgradeBuilds(t)
	mcs := cluster(t, 3)
	dead := startProbeCounter(t)
	dns := dnstest.Start(t)
	_, port, _ := net.SplitHostPort(freeAddr(t))
	var discPort int
	fmt.Sscan(port, &discPort)
	var disc []*memcachedtest.Server
	for _, host := range []string{"127.0.0.2", "127.0.0.3"} {
		disc = append(disc, memcachedtest.StartAt(t, net.JoinHostPort(host, port)))
	}
	dns.SetIPs("mc.test", "127.0.0.2", "127.0.0.3")
	config := func(main ...int) string {
		var s strings.Builder
		for _, i := range main {
			fmt.Fprintf(&s, "      - {name: s%d, addr: %q}\n", i, mcs[i].Addr)
		}
		return fmt.Sprintf(`watch_config: false
hot_keys: {sample: 1, window: 4s, min_share: 0.05}
pools:
  main:
    timeout: 2s
    migrate_rate: 30
    servers:
%s  disc:
    timeout: 2s
    discover: {dns: "mc.test.", port: %d, interval: 200ms, remove_after: %s, resolver: %q}
  gone:
    timeout: 200ms
    connections: 1
    failure_limit: 1
    dead_backoff: 50ms
    dead_backoff_max: 10s
    servers: [{name: g0, addr: %q}]
default_pool: main
routes:
  - {prefix: "disc:", pool: disc}
  - {prefix: "gone:", pool: gone}
`, s.String(), discPort, removeAfter, dns.Addr, dead.ln.Addr().String())
	}
	path := writeConfig(t, config(0, 1))
	u := startUpgradable(t, a, "--config", path)

	// The dead server: its probes back off 50 ms, 100 ms, 200 ms… while the rest is set up.
	misses(t, u.addr, []string{"gone:1", "gone:2"}) // answered with errors: it is down
	eventually(t, "g0 dead", func() bool { return serverStates(t, u.admin)["g0"] == "dead" })

	// The keys that will move, and a hot key among many cold ones.
	keys := make([]string, 2000)
	for i := range keys {
		keys[i] = fmt.Sprintf("k:%d", i)
	}
	setKeys(t, u.addr, keys)
	tc, err := dialText(u.addr)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3000 {
		key := "hot:1"
		if i%2 == 1 {
			key = keys[i%len(keys)]
		}
		if _, err := tc.get(key); err != nil {
			t.Fatal(err)
		}
	}
	tc.Close()
	isHot := func(lines []hotKeyLine) bool {
		return slices.ContainsFunc(lines, func(l hotKeyLine) bool { return l.Key == "hot:1" })
	}
	eventually(t, "hot:1 listed hot", func() bool { return isHot(hotKeys(t, u.admin)) })

	// A discovered server goes missing from the answers; main gets a third server.
	eventually(t, "both discovered servers in service", func() bool {
		got := serverStates(t, u.admin)
		return got[disc[0].Addr] == "up" && got[disc[1].Addr] == "up"
	})
	dns.SetIPs("mc.test", "127.0.0.2")
	missing := time.Now()
	if err := os.WriteFile(path, []byte(config(0, 1, 2)), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, body := postReload(t, u.admin); code != 200 {
		t.Fatalf("reload: %d %s", code, body)
	}
	eventually(t, "reshard-1 copying", func() bool {
		return slices.ContainsFunc(migrations(t, u.admin), func(m migrationJSON) bool { return m.Name == "reshard-1" })
	})
	// The probes' interval has grown to 1.6 s (50 ms doubled 5 times): the next is 3.2 s.
	eventually(t, "the dead server probed 1.6 s apart", func() bool { return dead.lastGap() >= 1500*time.Millisecond })
	probesBefore := dead.count()

	r := u.upgrade(b, false, 20*time.Second)
	ready := r.trigger.Add(r.ready)
	// The dead server's probes are counted over 3 s from here: the old process is gone, and
	// the successor's own first dial (before it learned the server is dead) is past.
	probesFrom := time.Now()
	if early := ready.Add(500 * time.Millisecond); probesFrom.Before(early) {
		probesFrom = early
	}
	t.Logf("upgraded: pid %d -> %d, ready after %v; the discovered server missing for %v; %d probes of the dead server before",
		r.oldPID, r.newPID, r.ready.Round(time.Millisecond), time.Since(missing).Round(time.Millisecond), probesBefore)

	if lines := hotKeys(t, u.admin); !isHot(lines) {
		t.Errorf("the successor's /hotkeys does not list hot:1: %+v", lines)
	} else {
		t.Logf("the successor's /hotkeys before any request: %+v", lines)
	}
	if time.Since(missing) < removeAfter-time.Second {
		if got := serverStates(t, u.admin); got[disc[1].Addr] == "" {
			t.Errorf("the successor dropped %s, missing from DNS for %v only (remove_after %v): /servers %v",
				disc[1].Addr, time.Since(missing).Round(time.Millisecond), removeAfter, got)
		}
	} else {
		t.Logf("the upgrade ended %v after the server went missing: its keeping is not checked", time.Since(missing).Round(time.Millisecond))
	}
	var moving *migrationJSON
	for _, m := range migrations(t, u.admin) {
		if m.Name == "reshard-1" {
			moving = &m
		}
	}
	switch {
	case moving == nil:
		t.Errorf("the successor's /migrations has no reshard-1: %+v", migrations(t, u.admin))
	case moving.Phase == "done":
		t.Logf("reshard-1 was done before the successor read a key: its read-through is not checked")
	default:
		got := misses(t, u.addr, keys)
		t.Logf("reshard-1 in the successor: %s, %d of %d keys copied; %d of the %d keys written before miss", moving.Phase, moving.KeysCopied, moving.KeysTotal, got, len(keys))
		if got != 0 {
			t.Errorf("%d of %d keys written before the reshard miss through the successor (reshard-1 %s)", got, len(keys), moving.Phase)
		}
	}

	// The dead server: probed at the backoff it had reached (3.2 s, then 6.4 s: once at most
	// in 3 s), not again from 50 ms (0.75 s, 1.55 s, 3.15 s… after its death: 2 or 3).
	window := probesFrom.Add(3 * time.Second)
	eventually(t, "3 s of the successor's probes", func() bool { return time.Now().After(window) })
	dead.mu.Lock()
	var rel []string
	for _, at := range dead.at {
		rel = append(rel, at.Sub(ready).Round(time.Millisecond).String())
	}
	dead.mu.Unlock()
	t.Logf("the dead server's probes in 3 s from %v after the successor was ready: %d (all, from ready: %v)",
		probesFrom.Sub(ready).Round(time.Millisecond), dead.between(probesFrom, window), rel)
	if n := dead.between(probesFrom, window); n > 1 {
		t.Errorf("the dead server was probed %d times in 3 s after the upgrade: its backoff started over", n)
	}
	if serverStates(t, u.admin)["g0"] != "dead" {
		t.Errorf("the successor does not show g0 dead: %v", serverStates(t, u.admin))
	}

	// The missing server goes at remove_after from when it went missing (slack for a
	// loaded machine), not remove_after after the upgrade.
	eventually(t, "the missing server removed", func() bool { return serverStates(t, u.admin)[disc[1].Addr] == "" })
	t.Logf("the server missing from DNS was removed %v after it went missing (remove_after %v)", time.Since(missing).Round(time.Millisecond), removeAfter)
	if took := time.Since(missing); took < removeAfter || took > removeAfter+3*time.Second {
		t.Errorf("the server missing from DNS was removed %v after it went missing, want remove_after (%v) + at most 3 s", took.Round(time.Millisecond), removeAfter)
	}
	waitReshard(t, u.admin, "reshard-1")
	if got := misses(t, u.addr, keys); got != 0 {
		t.Errorf("%d of %d keys miss once reshard-1 is done", got, len(keys))
	}
}
