package reload

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/topology"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// shards is a config of one embedded pool of n shards, so that changing n makes a reload
// build and retire servers.
func shards(n int) string {
	return "listen: 127.0.0.1:0\nadmin: \"\"\npools:\n  main:\n    embedded: " + string(rune('0'+n)) + "\n"
}

// harness is a Reloader over a real Builder and a file in a temporary directory.
type harness struct {
	t      *testing.T
	path   string
	r      *Reloader
	reg    *prometheus.Registry
	b      *topology.Builder
	mu     sync.Mutex
	swaps  int
	cancel context.CancelFunc
	done   chan struct{}
}

func newHarness(t *testing.T, initial string) *harness {
	t.Helper()
	h := &harness{t: t, path: filepath.Join(t.TempDir(), "moxi.yaml"), reg: prometheus.NewRegistry(), b: &topology.Builder{Logger: slog.New(slog.DiscardHandler)}}
	h.write(initial)
	loaded, err := Load(h.path, nil)
	if err != nil {
		t.Fatal(err)
	}
	pd, err := h.b.Build(loaded.Config)
	if err != nil {
		t.Fatal(err)
	}
	pd.Commit(0)
	h.r = New(Options{
		Path: h.path, Builder: h.b, Registry: h.reg, Interval: 10 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
		Swap: func(*topology.Topology) { h.mu.Lock(); h.swaps++; h.mu.Unlock() }, Initial: pd.Topology,
		Grace: func(*config.Config) time.Duration { return 5 * time.Millisecond },
	}, loaded)
	t.Cleanup(func() {
		h.stopWatching()
		if err := h.b.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return h
}

func (h *harness) write(body string) {
	h.t.Helper()
	// A new file renamed into place, as editors and ConfigMap updates do.
	tmp := h.path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o600); err != nil {
		h.t.Fatal(err)
	}
	if err := os.Rename(tmp, h.path); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) watch() {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done = cancel, make(chan struct{})
	go func() { defer close(h.done); h.r.Watch(ctx) }()
}

func (h *harness) stopWatching() {
	if h.cancel != nil {
		h.cancel()
		<-h.done
		h.cancel = nil
	}
}

func (h *harness) reloads(result string) float64 {
	var m dto.Metric
	if err := h.r.reloads.WithLabelValues(result).Write(&m); err != nil {
		h.t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func (h *harness) embedded() int { return h.r.Config().Pools[0].Embedded }

// waitLooks waits until the watcher has looked at the file n more times.
func (h *harness) waitLooks(n int64) {
	h.t.Helper()
	target := h.r.looks.Load() + n
	h.waitFor("watcher looks", func() bool { return h.r.looks.Load() >= target })
}

// waitFor polls cond for up to 10 s.
func (h *harness) waitFor(what string, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestWatchAppliesEditBeforeWatchStarts: an edit made between loading the config and the
// watcher's start is applied; the watcher compares with the bytes in service, not with
// what it first saw.
func TestWatchAppliesEditBeforeWatchStarts(t *testing.T) {
	h := newHarness(t, shards(1))
	h.write(shards(2))
	h.watch()
	h.waitFor("edit applied", func() bool { return h.embedded() == 2 })
	if n := h.reloads("ok"); n != 1 {
		t.Errorf("%v reloads, want 1", n)
	}
}

// TestReloadByAnyPathIsNotRepeatedByTheWatcher: a file applied by SIGHUP or POST /reload is
// in service; the watcher does not apply it again.
func TestReloadByAnyPathIsNotRepeatedByTheWatcher(t *testing.T) {
	h := newHarness(t, shards(1))
	h.write(shards(2))
	if _, err := h.r.Reload("test"); err != nil {
		t.Fatal(err)
	}
	h.watch()
	h.waitLooks(10) // none of them may reload
	if n := h.reloads("ok"); n != 1 {
		t.Fatalf("%v reloads after the watcher saw the file already in service, want 1", n)
	}
	h.write(shards(3))
	h.waitFor("edit applied", func() bool { return h.embedded() == 3 })
	if n := h.reloads("ok"); n != 2 {
		t.Errorf("%v reloads, want 2", n)
	}
}

// TestWatchTriesBadContentOnce: a file that fails to load is reported once, not every
// second, and the next good edit is applied.
func TestWatchTriesBadContentOnce(t *testing.T) {
	h := newHarness(t, shards(1))
	h.watch()
	h.write("pools:\n  main:\n    distribution: nope\n    embedded: 1\n")
	h.waitFor("bad file reported", func() bool { return h.reloads("error") == 1 })
	h.waitLooks(10) // at the same bad bytes
	if n := h.reloads("error"); n != 1 {
		t.Errorf("bad file reported %v times, want once", n)
	}
	h.write(shards(2))
	h.waitFor("good edit applied", func() bool { return h.embedded() == 2 })
	if h.embedded() != 2 || h.reloads("ok") != 1 {
		t.Errorf("embedded %d, %v ok reloads", h.embedded(), h.reloads("ok"))
	}
}

// TestConcurrentReloads: SIGHUP, POST /reload and the watcher reloading at once, each
// retiring servers after a grace period, share no state (run with -race).
func TestConcurrentReloads(t *testing.T) {
	h := newHarness(t, shards(1))
	h.watch()
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				if w == 0 {
					h.write(shards(1 + i%3))
				}
				if _, err := h.r.Reload("test"); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	h.stopWatching()
	if n := h.reloads("error"); n != 0 {
		t.Errorf("%v failed reloads", n)
	}
}

// TestReloadSummary: the answer and the log line name each change, and restart-only
// settings are compared with what the process runs: listen set back to the running
// address is no change, though the file in service had another.
func TestReloadSummary(t *testing.T) {
	const base = "listen: 127.0.0.1:0\nadmin: \"\"\npools:\n  main:\n    servers:\n      - 127.0.0.1:11212\n"
	h := newHarness(t, base)
	var logs bytes.Buffer
	h.r.opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	steps := []struct {
		name, file, want string
	}{
		{"server added and timeout", base + "      - 127.0.0.1:11213\n    timeout: 300ms\n",
			"pool main: servers added: 127.0.0.1:11213\npool main: timeout 250ms → 300ms\n"},
		{"listen moved", "listen: 127.0.0.1:1\n" + base[len("listen: 127.0.0.1:0\n"):],
			"listen 127.0.0.1:0 → 127.0.0.1:1 (takes effect at the next restart)\n" +
				"pool main: servers removed: 127.0.0.1:11213\npool main: timeout 300ms → 250ms\n"},
		{"listen back to the running address", base, "no changes\n"},
		{"route and top-level setting", base + "  spare:\n    embedded: 1\ndefault_pool: main\nroutes: [{prefix: \"s:\", pool: spare}]\ndedup: false\n",
			"pool spare: added\n" + `routes: "s:" → spare added` + "\ndedup true → false\n"},
	}
	for _, s := range steps {
		h.write(s.file)
		got, err := h.r.Reload("test")
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got != s.want {
			t.Errorf("%s: summary\n%s\nwant\n%s", s.name, got, s.want)
		}
	}
	want := `changes="pool main: servers added: 127.0.0.1:11213; pool main: timeout 250ms → 300ms"`
	if !strings.Contains(logs.String(), want) {
		t.Errorf("log lacks %s:\n%s", want, logs.String())
	}
	if n := strings.Count(logs.String(), "next restart"); n != 1 {
		t.Errorf("%d log lines say a restart is needed, want 1 (listen moved, not listen moved back):\n%s", n, logs.String())
	}
}

// TestWatchOffAppliesNothing: with watch_config off the watcher applies no edit of the file,
// however long it runs (ten of its intervals, on a fake clock), and a reload by another way
// still applies it.
func TestWatchOffAppliesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		off := func(n int) string { return shards(n) + "watch_config: false\n" }
		h := newHarness(t, off(1))
		h.watch()
		h.write(off(2))
		time.Sleep(10 * h.r.opts.Interval) // the bubble's fake clock: ten of the watcher's looks, at once
		synctest.Wait()
		if got := h.embedded(); got != 1 {
			t.Fatalf("an edit was applied with watch_config off: %d shards", got)
		}
		h.stopWatching()
		if _, err := h.r.Reload("test"); err != nil || h.embedded() != 2 {
			t.Fatalf("a reload by another way: %v, %d shards", err, h.embedded())
		}
	})
}
