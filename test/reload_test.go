package test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

func postReload(t testing.TB, admin string) (int, string) {
	t.Helper()
	resp, err := http.Post("http://"+admin+"/reload", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func getText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// metricValue reads one sample line of /metrics, e.g. `moxi_config_reloads_total{result="ok"}`.
func metricValue(t *testing.T, admin, series string) float64 {
	t.Helper()
	v, ok := seriesValue(t, admin, series)
	if !ok {
		t.Fatalf("/metrics has no %s", series)
	}
	return v
}

// counterValue is metricValue of a counter that exists once it counted something (a
// backend error kind, a command): 0 while /metrics has no such series.
func counterValue(t *testing.T, admin, series string) float64 {
	t.Helper()
	v, _ := seriesValue(t, admin, series)
	return v
}

// seriesValue is the value of series (its name and labels as /metrics writes them), and
// whether /metrics has it.
func seriesValue(t *testing.T, admin, series string) (float64, bool) {
	t.Helper()
	for _, line := range strings.Split(getText(t, "http://"+admin+"/metrics"), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f, true
		}
	}
	return 0, false
}

func totalConnections(t *testing.T, addr string) int {
	t.Helper()
	n, _ := strconv.Atoi(memcachedtest.Stats(t, addr)["total_connections"])
	return n
}

// TestReloadUnderLoad reloads 100 times while clients keep reading and writing: no client
// request fails, unchanged servers keep their connections, and every reload is counted.
func TestReloadUnderLoad(t *testing.T) {
	t.Parallel() // mostly waits (timers, expiries, child tools): beside the other waiting tests
	mcs := cluster(t, 2)
	// A and B differ in pool settings and routes but not in how moxi talks to any server,
	// so their servers (and connections) are shared; C changes main's timeout, so its
	// servers are made anew, and so are they again on the reload after.
	pools := func(mainExtra string) string {
		return fmt.Sprintf("watch_config: false\npools:\n  main:\n%s    servers: [%s, %s]\n  other:\n    timeout: 2s\n    servers: [%s]\ndefault_pool: main\n",
			mainExtra, mcs[0].Addr, mcs[1].Addr, mcs[1].Addr)
	}
	configs := []string{
		pools("    timeout: 2s\n"),
		pools("    timeout: 2s\n    retries: 2\n") + "routes:\n  - prefix: \"other:\"\n    pool: other\n",
		pools("    timeout: 3s\n"),
	}
	path := writeConfig(t, configs[0])
	admin := freeAddr(t)
	moxi := startMoxi(t, "--config", path, "--admin", admin)
	var keys []string
	for i := range 100 {
		keys = append(keys, "r:"+strconv.Itoa(i))
	}
	conns := make([]int, len(mcs))
	for i, mc := range mcs {
		conns[i] = totalConnections(t, mc.Addr)
	}

	stop := make(chan struct{})
	var outcomes []outcome
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); outcomes = load(t, moxi.addr, keys, 4, stop) }()
	renewed := 0
	for i := 1; i <= 100; i++ {
		conf := configs[i%2]
		if i%10 == 0 {
			conf, renewed = configs[2], renewed+1
		}
		if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		if code, body := postReload(t, admin); code != http.StatusOK {
			t.Fatalf("reload %d: %d %s", i, code, body)
		}
	}
	close(stop)
	wg.Wait()

	failed := 0
	for _, o := range outcomes {
		if o.err != "" {
			if failed < 5 {
				t.Errorf("request for %s failed during reloads: %s", o.key, o.err)
			}
			failed++
		}
	}
	t.Logf("100 reloads under load: %d client requests, %d failed", len(outcomes), failed)
	if len(outcomes) == 0 {
		t.Fatal("no load ran")
	}
	if ok := metricValue(t, admin, `moxi_config_reloads_total{result="ok"}`); ok != 100 {
		t.Errorf("moxi_config_reloads_total{result=\"ok\"} = %v, want 100", ok)
	}
	// Reloads that keep a server keep its connections; only the ones that change its
	// settings (every 10th, and the one after) open new ones: 4 per server each time.
	for i, mc := range mcs {
		grown := totalConnections(t, mc.Addr) - conns[i]
		limit := 2*renewed*4 + 20 // 4 connections each time main's servers are renewed; slack for the test's own
		t.Logf("server %d: %d new connections over 100 reloads (%d of them changed its settings)", i, grown, 2*renewed)
		if grown > limit {
			t.Errorf("server %d: %d new connections over 100 reloads; unchanged servers must keep theirs", i, grown)
		}
	}
}

// TestReloadRejectsBadFiles: a bad file is answered 400 with the reason, counted, and the
// running topology keeps serving.
func TestReloadRejectsBadFiles(t *testing.T) {
	mc := memcachedtest.Start(t)
	good := fmt.Sprintf("watch_config: false\npools:\n  main:\n    servers: [%s]\n", mc.Addr)
	path := writeConfig(t, good)
	admin := freeAddr(t)
	moxi := startMoxi(t, "--config", path, "--admin", admin)
	c, err := dialText(moxi.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if ans, err := c.set("bad:k", "v"); err != nil || ans != "STORED" {
		t.Fatalf("set: %q %v", ans, err)
	}
	before := getText(t, "http://"+admin+"/config")
	cases := []struct{ name, file, reason string }{
		{"bad YAML", "pools: [unclosed\n", "yaml"},
		{"unknown key", good + "colour: blue\n", "colour: unknown key"},
		{"route to a missing pool", good + "routes:\n  - prefix: \"x:\"\n    pool: nowhere\n", "nowhere"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(path, []byte(tc.file), 0o644); err != nil {
				t.Fatal(err)
			}
			code, body := postReload(t, admin)
			if code != http.StatusBadRequest || !strings.Contains(body, tc.reason) {
				t.Errorf("POST /reload: %d %q; want 400 naming %q", code, body, tc.reason)
			}
			if v, err := c.get("bad:k"); err != nil || v != "v" {
				t.Errorf("traffic after a rejected reload: %q %v", v, err)
			}
			if after := getText(t, "http://"+admin+"/config"); after != before {
				t.Errorf("a rejected reload changed the running config:\n%s", after)
			}
		})
	}
	if n := metricValue(t, admin, `moxi_config_reloads_total{result="error"}`); n != float64(len(cases)) {
		t.Errorf("moxi_config_reloads_total{result=\"error\"} = %v, want %d", n, len(cases))
	}
}

// TestWatchConfig: with watch_config on, an edit of the file, and a Kubernetes-style
// ConfigMap update (a symlink swapped to a new directory), are in service within 3 s; so
// is a SIGHUP. The 3 s is checked with a margin for a loaded machine (×4 + 1 s) and the
// measured figures logged.
func TestWatchConfig(t *testing.T) {
	t.Parallel() // mostly waits for instants and polls: runs beside the other such tests
	mcs := cluster(t, 2)
	dir := t.TempDir()
	conf := func(server string) string {
		return fmt.Sprintf("watch_config: true\npools:\n  main:\n    servers: [%s]\n", server)
	}
	// The ConfigMap layout: moxi.yaml -> ..data/moxi.yaml, ..data -> ..v1.
	writeVersion := func(name, content string) {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "moxi.yaml"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	swapData := func(name string) {
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(name, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil { // atomic, as the kubelet does
			t.Fatal(err)
		}
	}
	writeVersion("..v1", conf(mcs[0].Addr))
	swapData("..v1")
	path := filepath.Join(dir, "moxi.yaml")
	if err := os.Symlink(filepath.Join("..data", "moxi.yaml"), path); err != nil {
		t.Fatal(err)
	}
	admin := freeAddr(t)
	moxi := startMoxi(t, "--config", path, "--admin", admin)

	inService := func(server string) bool {
		return strings.Contains(getText(t, "http://"+admin+"/config"), server)
	}
	const contract = 3 * time.Second
	bound := 4*contract + time.Second
	writeVersion("..v2", conf(mcs[1].Addr))
	changed := time.Now()
	swapData("..v2")
	swapTook := waitUntil(t, changed, 20*time.Second, func() bool { return inService(mcs[1].Addr) })
	t.Logf("ConfigMap-style symlink swap in service after %v (contract %v, checked ≤ %v)", swapTook.Round(time.Millisecond), contract, bound)
	if swapTook > bound {
		t.Errorf("symlink swap took %v to be picked up; want within %v (checked ≤ %v)", swapTook, contract, bound)
	}

	// A plain edit of the file the symlinks lead to.
	if err := os.WriteFile(filepath.Join(dir, "..v2", "moxi.yaml"), []byte(conf(mcs[0].Addr)), 0o644); err != nil {
		t.Fatal(err)
	}
	changed = time.Now()
	editTook := waitUntil(t, changed, 20*time.Second, func() bool { return inService(mcs[0].Addr) })
	t.Logf("file edit in service after %v (contract %v, checked ≤ %v)", editTook.Round(time.Millisecond), contract, bound)
	if editTook > bound {
		t.Errorf("file edit took %v to be picked up; want within %v (checked ≤ %v)", editTook, contract, bound)
	}

	// SIGHUP, with watching off so that only the signal can do it.
	if err := os.WriteFile(filepath.Join(dir, "..v2", "moxi.yaml"), []byte(strings.Replace(conf(mcs[1].Addr), "watch_config: true", "watch_config: false", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Now(), 20*time.Second, func() bool { return inService(mcs[1].Addr) }) // the watcher applies it, turning itself off
	if err := os.WriteFile(filepath.Join(dir, "..v2", "moxi.yaml"), []byte(strings.Replace(conf(mcs[0].Addr), "watch_config: true", "watch_config: false", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	// The watcher is off: that it then applies no edit, however long it runs, is
	// internal/reload's TestWatchOffAppliesNothing (on a fake clock); here the signal does.
	if err := moxi.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Now(), 20*time.Second, func() bool { return inService(mcs[0].Addr) })
}
