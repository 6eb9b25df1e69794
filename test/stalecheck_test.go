package test

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// staleCheck tracks, per key, the newest version acknowledged, and counts reads older.
type staleCheck struct {
	keys    []string
	newest  map[string]*atomic.Int64
	ackedAt map[string]*atomic.Int64 // when the newest was acknowledged, unix nanoseconds

	reads, stale, acked atomic.Int64
	// around, when set, is an instant (a scheduled switch) within 100 ms of which stale
	// reads are counted in nearStale instead: the clocks' and timers' skew.
	around    time.Time
	nearStale atomic.Int64
	mu        sync.Mutex
	errs      map[string]int
	seen      []string
}

func newStaleCheck(keys []string) *staleCheck {
	c := &staleCheck{keys: keys, newest: make(map[string]*atomic.Int64), ackedAt: make(map[string]*atomic.Int64), errs: make(map[string]int)}
	for _, k := range keys {
		c.newest[k], c.ackedAt[k] = new(atomic.Int64), new(atomic.Int64)
	}
	return c
}

// maxOps bounds each load goroutine, whatever the machine's speed.
const maxOps = 200_000

// write stores rising versions of its share of the keys (every n'th, from w) until stop.
// Versions are decimal numbers; a key holding none reads as version 0.
func (c *staleCheck) write(t *testing.T, addr string, w, n int, stop <-chan struct{}) {
	tc, err := dialText(addr)
	if err != nil {
		t.Error(err)
		return
	}
	defer tc.Close()
	for v := int64(1); v < maxOps; v++ {
		select {
		case <-stop:
			return
		default:
		}
		for i := w; i < len(c.keys); i += n {
			k := c.keys[i]
			ans, err := tc.set(k, strconv.FormatInt(v, 10))
			if err != nil {
				t.Error(err)
				return
			}
			if ans == "STORED" {
				c.newest[k].Store(v)
				c.ackedAt[k].Store(time.Now().UnixNano())
				c.acked.Add(1)
			} else {
				c.fail(k)
			}
		}
	}
}

// read reads random keys until stop and compares each with what was acknowledged before.
func (c *staleCheck) read(t *testing.T, addr string, stop <-chan struct{}) {
	tc, err := dialText(addr)
	if err != nil {
		t.Error(err)
		return
	}
	defer tc.Close()
	for range maxOps {
		select {
		case <-stop:
			return
		default:
		}
		k := c.keys[rand.IntN(len(c.keys))]
		floor, sent := c.newest[k].Load(), time.Now()
		v, err := tc.get(k)
		if err != nil {
			t.Error(err)
			return
		}
		c.reads.Add(1)
		if strings.HasPrefix(v, "SERVER_ERROR") {
			c.fail(k)
			continue
		}
		if v == "" {
			continue // a miss: a cache may forget
		}
		if got := versionIn(v); got < floor {
			if d := sent.Sub(c.around); !c.around.IsZero() && d > -100*time.Millisecond && d < 100*time.Millisecond {
				c.nearStale.Add(1)
				continue
			}
			c.stale.Add(1)
			c.mu.Lock()
			if len(c.seen) < 10 {
				c.seen = append(c.seen, fmt.Sprintf("%s read %d after %d was acknowledged", k, got, floor))
			}
			c.mu.Unlock()
		}
	}
}

func (c *staleCheck) fail(k string) {
	c.mu.Lock()
	c.errs[k]++
	c.mu.Unlock()
}

func (c *staleCheck) errorsByKey() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.errs
}

func (c *staleCheck) examples() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen
}

// versionIn is the version a value written by staleCheck holds; 0 for any other value.
func versionIn(v string) int64 {
	n, _ := strconv.ParseInt(v, 10, 64)
	return n
}

// tierProxy is one moxi of a tier in front of the same servers, with its config file and
// admin address.
type tierProxy struct {
	path, admin string
	moxi        *process
}

// startTier starts two moxi processes on config yaml.
func startTier(t *testing.T, yaml string) [2]tierProxy {
	t.Helper()
	var tier [2]tierProxy
	for i := range tier {
		p := &tier[i]
		p.path, p.admin = writeConfig(t, inTier(yaml)), freeAddr(t)
		p.moxi = startMoxi(t, "--config", p.path, "--admin", p.admin)
	}
	return tier
}

// inTier is yaml as a tier whose clients read through one proxy what they wrote through the
// other is configured (docs/configuration.md, "Hot keys"): without dedup, whose shared fetches only a
// write through the same proxy ends, so that a get may otherwise join a fetch that left
// before the other proxy's write was applied. POST /reload alone reloads it: a watcher that
// saw the file's write first would leave the reload "no changes" to report.
func inTier(yaml string) string {
	if !strings.Contains(yaml, "watch_config:") {
		yaml = "watch_config: false\n" + yaml
	}
	return "dedup: false\n" + yaml
}

// reload writes yaml to p's file and reloads it; the answer must contain want.
func (p *tierProxy) reload(t *testing.T, yaml, want string) {
	t.Helper()
	if err := os.WriteFile(p.path, []byte(inTier(yaml)), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, body := postReload(t, p.admin); code != http.StatusOK || !strings.Contains(body, want) {
		t.Fatalf("reload: %d %s", code, body)
	}
}
