package test

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// TestMigrationTier: two moxi processes serve the same servers; the migration of s1 to a
// new server reaches them 4 s apart, with migrate_at 10 s ahead of the first. A writer
// through each proxy updates its own share of s1's keys, readers through both check every
// answer against the newest version acknowledged before the read was sent. No read is
// older (outside ±100 ms of migrate_at), no acknowledged write is lost once both copies
// are done, and OLD holds no value older than one acknowledged before the first was done.
func TestMigrationTier(t *testing.T) {
	t.Parallel() // mostly waits for instants and polls: runs beside the other such tests
	mcs := cluster(t, 3)
	fresh := memcachedtest.Start(t)
	tier := startTier(t, migrationConfig(mcs[0].Addr, mcs[1].Addr, mcs[2].Addr, "", 0))
	owner := owners(3)
	var moved []string // s1's keys
	c, err := dialText(tier[0].moxi.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := 0; len(moved) < 2000; i++ {
		k := "tier:" + strconv.Itoa(i)
		if owner(k) != 1 {
			continue
		}
		if ans, err := c.set(k, "0"); err != nil || ans != "STORED" {
			t.Fatalf("set %s: %q %v", k, ans, err)
		}
		moved = append(moved, k)
	}

	at := time.Now().Add(10 * time.Second)
	after := strings.Replace(migrationConfig(mcs[0].Addr, fresh.Addr, mcs[2].Addr, mcs[1].Addr, 0),
		fmt.Sprintf("migrate_from: %q}", mcs[1].Addr),
		fmt.Sprintf("migrate_from: %q, migrate_at: %q}", mcs[1].Addr, at.UTC().Format(time.RFC3339Nano)), 1)
	tier[0].reload(t, after, "")

	chk := newStaleCheck(moved)
	chk.around = at
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range tier {
		wg.Add(1) // the writer of 40 keys, through proxy w
		go func() { defer wg.Done(); chk.write(t, tier[w].moxi.addr, w, 50, stop) }()
	}
	for r := range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); chk.read(t, tier[r%2].moxi.addr, stop) }()
	}

	// The second proxy gets the file 4 s after the first: the tier's reloads are apart.
	<-time.After(4 * time.Second)
	tier[1].reload(t, after, "")
	var firstDone time.Time // once a proxy is done, its writes leave OLD alone
	for i := range tier {
		waitUntil(t, time.Now(), 60*time.Second, func() bool {
			ms := migrations(t, tier[i].admin)
			return len(ms) == 1 && (ms[0].Phase == "done" || ms[0].Phase == "failed")
		})
		ms := migrations(t, tier[i].admin)
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
	t.Logf("%d reads, %d stale (%d more within 100 ms of migrate_at), %d acknowledged writes", chk.reads.Load(), chk.stale.Load(), chk.nearStale.Load(), chk.acked.Load())
	if chk.stale.Load() > 0 {
		t.Errorf("%d stale reads outside ±100 ms of migrate_at:\n%s", chk.stale.Load(), strings.Join(chk.examples(), "\n"))
	}
	if chk.acked.Load() < 100 || chk.reads.Load() < 100 {
		t.Errorf("only %d acknowledged writes and %d reads: the check saw too little", chk.acked.Load(), chk.reads.Load())
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
		} else if v != "" && versionIn(v) < chk.newest[k].Load() && chk.ackedAt[k].Load() < firstDone.UnixNano() {
			older++
		}
	}
	lost, reverted := 0, 0
	for i := range tier {
		tc, err := dialText(tier[i].moxi.addr)
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
			case versionIn(v) != chk.newest[k].Load():
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
