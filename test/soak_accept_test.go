//go:build accept

package test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestAcceptRaceSoak runs the race-detector build of moxi through 100 reloads under load —
// SIGHUP, POST /reload and file edits picked up by watch_config, mixed — with a live
// migration started part-way and a server killed later. The harness fails the test if the
// binary reports a data race at any point; the test itself checks that every reload was
// applied and that moxi still answers at the end.
func TestAcceptRaceSoak(t *testing.T) {
	t.Parallel()         // reloads and answers checked, nothing timed (20 s per reload): beside the waiting checks
	mcs := cluster(t, 4) // s0..s2 in service, mcs[3] the migration's new server
	soakConfig := func(i int, migrating bool) string {
		s1 := fmt.Sprintf("{name: s1, addr: %q}", mcs[1].Addr)
		if migrating {
			s1 = fmt.Sprintf("{name: s1, addr: %q, migrate_from: %q}", mcs[3].Addr, mcs[1].Addr)
		}
		// retries alternates so that every reload changes something; the servers keep
		// their connections (retries is not part of how moxi talks to a server).
		return fmt.Sprintf(`watch_config: true
pools:
  main:
    timeout: 1s
    retries: %d
    failure_limit: 2
    dead_backoff: 50ms
    dead_backoff_max: 200ms
    servers:
      - {name: s0, addr: %q}
      - %s
      - {name: s2, addr: %q}
`, 1+i%2, mcs[0].Addr, s1, mcs[2].Addr)
	}
	path := writeConfig(t, soakConfig(0, false))
	admin := freeAddr(t)
	moxi := startMoxi(t, "--config", path, "--admin", admin)

	keys := make([]string, 200)
	for i := range keys {
		keys[i] = "soak:" + strconv.Itoa(i)
	}
	stop := make(chan struct{})
	var outcomes []outcome
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); outcomes = load(t, moxi.addr, keys, 4, stop) }()

	applied := func() float64 { return metricValue(t, admin, `moxi_config_reloads_total{result="ok"}`) }
	var sources [3]int
	for i := 1; i <= 100; i++ {
		migrating := i >= 40
		// Counted before the edit: the watcher may apply it at once (for every source, as
		// watch_config is on; SIGHUP or POST /reload then applies it again).
		before := applied()
		if err := os.WriteFile(path, []byte(soakConfig(i, migrating)), 0o644); err != nil {
			t.Fatal(err)
		}
		switch {
		case i%10 == 0: // the watcher picks the edit up
			sources[0]++
		case i%2 == 0:
			sources[1]++
			if err := moxi.cmd.Process.Signal(syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
		default:
			sources[2]++
			if code, body := postReload(t, admin); code != http.StatusOK {
				t.Fatalf("reload %d: %d %s", i, code, body)
			}
		}
		deadline := time.Now().Add(20 * time.Second)
		for applied() < before+1 {
			if time.Now().After(deadline) {
				t.Fatalf("reload %d not applied within 20s", i)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if i == 40 {
			checkMigratingSlot(t, admin, moxi.addr)
		}
		if i == 70 {
			mcs[2].Stop() // killed: its keys fail over to the others
		}
	}
	close(stop)
	wg.Wait()

	failed := 0
	for _, o := range outcomes {
		if o.err != "" {
			failed++
		}
	}
	t.Logf("100 reloads (%d by file edit, %d SIGHUP, %d POST /reload), a migration and a killed server under load: %d requests, %d answered with an error",
		sources[0], sources[1], sources[2], len(outcomes), failed)
	if len(outcomes) == 0 {
		t.Fatal("no load ran")
	}
	c, err := dialText(moxi.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if ans, err := c.set("soak:last", "v"); err != nil || ans != "STORED" {
		t.Fatalf("set after the soak: %q %v", ans, err)
	}
}

// checkMigratingSlot: the slot being migrated (s1) shows its new server's health and
// counters in /servers, /metrics and stats proxy, as any other server does.
func checkMigratingSlot(t *testing.T, admin, addr string) {
	t.Helper()
	var s1 struct {
		State       string
		Connections int
	}
	var list []map[string]any
	if err := json.Unmarshal([]byte(getText(t, "http://"+admin+"/servers")), &list); err != nil {
		t.Fatal(err)
	}
	for _, srv := range list {
		if srv["name"] == "s1" {
			s1.State, _ = srv["state"].(string)
			n, _ := srv["connections"].(float64)
			s1.Connections = int(n)
		}
	}
	if s1.State != "up" && s1.State != "migrating" || s1.Connections == 0 {
		t.Errorf("/servers shows the migrating slot as %+v; want its new server's state and connections", s1)
	}
	if up := metricValue(t, admin, `moxi_backend_up{pool="main",server="s1"}`); up != 1 {
		t.Errorf("moxi_backend_up of the migrating slot %v, want 1", up)
	}
	if n := metricValue(t, admin, `moxi_backend_requests_total{pool="main",server="s1"}`); n == 0 {
		t.Error("moxi_backend_requests_total of the migrating slot is 0")
	}
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	lines := roundTrip(t, nc, bufio.NewReader(nc), "stats proxy\r\n", "END")
	if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "STAT main:s1:requests ") }) {
		t.Errorf("stats proxy has no requests line for the migrating slot: %q", lines)
	}
}
