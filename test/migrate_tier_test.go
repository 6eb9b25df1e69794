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

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// TestMigrationTier: two moxi processes serve the same servers; the migration of s1 to a
// new server reaches them 4 s apart, with migrate_at 10 s ahead of the first. A writer
// through each proxy updates its own half of s1's keys, readers through both check every
// answer against the newest version acknowledged before the read was sent. No read is
// older (outside ±100 ms of migrate_at), no acknowledged write is lost once both copies
// are done, and OLD holds no value older than an acknowledged one.
func TestMigrationTier(t *testing.T) {
	mcs := cluster(t, 3)
	fresh := memcachedtest.Start(t)
	before := migrationConfig(mcs[0].Addr, mcs[1].Addr, mcs[2].Addr, "", 0)
	type proxy struct {
		path, admin string
		moxi        *process
	}
	var proxies [2]proxy
	for i := range proxies {
		p := &proxies[i]
		p.path, p.admin = writeConfig(t, before), freeAddr(t)
		p.moxi = startMoxi(t, "--config", p.path, "--admin", p.admin)
	}
	owner := owners(3)
	var moved []string // s1's keys
	c, err := dialText(proxies[0].moxi.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := 0; len(moved) < 2000; i++ {
		k := "tier:" + strconv.Itoa(i)
		if owner(k) != 1 {
			continue
		}
		if ans, err := c.set(k, "v0:"+k); err != nil || ans != "STORED" {
			t.Fatalf("set %s: %q %v", k, ans, err)
		}
		moved = append(moved, k)
	}
	newest := make(map[string]*atomic.Int64, len(moved))  // the newest version acknowledged
	ackedAt := make(map[string]*atomic.Int64, len(moved)) // when, in unix nanoseconds
	for _, k := range moved {
		newest[k], ackedAt[k] = new(atomic.Int64), new(atomic.Int64)
	}

	at := time.Now().Add(10 * time.Second)
	after := strings.Replace(migrationConfig(mcs[0].Addr, fresh.Addr, mcs[2].Addr, mcs[1].Addr, 0),
		fmt.Sprintf("migrate_from: %q}", mcs[1].Addr),
		fmt.Sprintf("migrate_from: %q, migrate_at: %q}", mcs[1].Addr, at.UTC().Format(time.RFC3339Nano)), 1)
	reload := func(p *proxy) {
		if err := os.WriteFile(p.path, []byte(after), 0o644); err != nil {
			t.Fatal(err)
		}
		if code, body := postReload(t, p.admin); code != http.StatusOK {
			t.Fatalf("reload: %d %s", code, body)
		}
	}
	reload(&proxies[0])

	var stale, staleNearAt, reads, acked atomic.Int64
	var mu sync.Mutex
	var examples []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range proxies {
		wg.Add(1)
		go func() { // the writer of half the keys, through proxy w
			defer wg.Done()
			tc, err := dialText(proxies[w].moxi.addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer tc.Close()
			for v := int64(1); v < maxOps; v++ {
				for i := w; i < len(moved); i += 2 * 25 { // 40 keys each, rewritten often
					select {
					case <-stop:
						return
					default:
					}
					k := moved[i]
					if ans, err := tc.set(k, fmt.Sprintf("v%d:%s", v, k)); err != nil {
						t.Error(err)
						return
					} else if ans == "STORED" {
						newest[k].Store(v)
						ackedAt[k].Store(time.Now().UnixNano())
						acked.Add(1)
					}
				}
			}
		}()
	}
	for r := range 4 {
		wg.Add(1)
		go func() { // a reader through proxy r%2
			defer wg.Done()
			tc, err := dialText(proxies[r%2].moxi.addr)
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
				k := moved[rand.IntN(len(moved))]
				floor, sent := newest[k].Load(), time.Now()
				v, err := tc.get(k)
				if err != nil {
					t.Error(err)
					return
				}
				reads.Add(1)
				if v == "" || strings.HasPrefix(v, "SERVER_ERROR") {
					continue
				}
				if got := int64(versionOf(v)); got < floor {
					if d := sent.Sub(at); d > -100*time.Millisecond && d < 100*time.Millisecond {
						staleNearAt.Add(1)
						continue
					}
					stale.Add(1)
					mu.Lock()
					if len(examples) < 10 {
						examples = append(examples, fmt.Sprintf("%s read v%d after v%d, %v from migrate_at", k, got, floor, sent.Sub(at).Round(time.Millisecond)))
					}
					mu.Unlock()
				}
			}
		}()
	}

	// The second proxy gets the file 4 s after the first: the tier's reloads are apart.
	<-time.After(4 * time.Second)
	reload(&proxies[1])
	var firstDone time.Time // once a proxy is done, its writes leave OLD alone
	for i := range proxies {
		waitUntil(t, time.Now(), 60*time.Second, func() bool {
			ms := migrations(t, proxies[i].admin)
			return len(ms) == 1 && (ms[0].Phase == "done" || ms[0].Phase == "failed")
		})
		ms := migrations(t, proxies[i].admin)
		if ms[0].Phase != "done" {
			t.Fatalf("proxy %d: migration %+v", i, ms[0])
		}
		done, err := time.Parse(time.RFC3339Nano, ms[0].Finished)
		if err != nil {
			t.Fatal(err)
		}
		if firstDone.IsZero() || done.Before(firstDone) {
			firstDone = done
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("%d reads, %d stale (%d more within 100 ms of migrate_at), %d acknowledged writes", reads.Load(), stale.Load(), staleNearAt.Load(), acked.Load())
	if stale.Load() > 0 {
		t.Errorf("%d stale reads outside ±100 ms of migrate_at:\n%s", stale.Load(), strings.Join(examples, "\n"))
	}
	if acked.Load() < 100 || reads.Load() < 100 {
		t.Errorf("only %d acknowledged writes and %d reads: the check saw too little", acked.Load(), reads.Load())
	}

	// Both done: OLD keeps nothing older than acknowledged before the first was done, and
	// no acknowledged write is lost or reverted, through either proxy.
	older := 0
	old, err := dialText(mcs[1].Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	for _, k := range moved {
		if v, err := old.get(k); err != nil {
			t.Fatal(err)
		} else if v != "" && int64(versionOf(v)) < newest[k].Load() && ackedAt[k].Load() < firstDone.UnixNano() {
			older++
		}
	}
	lost, reverted := 0, 0
	for i := range proxies {
		tc, err := dialText(proxies[i].moxi.addr)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range moved {
			v, err := tc.get(k)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case v == "":
				lost++
			case int64(versionOf(v)) != newest[k].Load():
				reverted++
			}
		}
		tc.Close()
	}
	t.Logf("when done: %d values on OLD older than acknowledged; %d lost, %d reverted (both proxies)", older, lost, reverted)
	if older+lost+reverted > 0 {
		t.Errorf("when done: %d values on OLD older than acknowledged; %d lost, %d reverted", older, lost, reverted)
	}
}
