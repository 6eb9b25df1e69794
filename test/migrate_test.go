package test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

type migrationJSON struct {
	Pool, Name, From, To, Phase string
	KeysCopied                  int64  `json:"keys_copied"`
	KeysTotal                   int64  `json:"keys_total"`
	Started, Finished           string // RFC 3339; Finished "" until done
	Error                       string
}

func migrations(t testing.TB, admin string) []migrationJSON {
	t.Helper()
	out, err := getMigrations(admin)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// getMigrations is migrations for goroutines other than the test's.
func getMigrations(admin string) ([]migrationJSON, error) {
	resp, err := http.Get("http://" + admin + "/migrations")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out []migrationJSON
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, err
	}
	return out, nil
}

// copyReached waits until the one migration listed has copied at least n keys, or is no
// longer copying, or stop closes, polling every 10 ms for at most 20 s.
func copyReached(admin string, n int64, stop <-chan struct{}) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		ms, err := getMigrations(admin)
		if err != nil {
			return err
		}
		if len(ms) != 1 || ms[0].Phase != "copying" || ms[0].KeysCopied >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the copy stayed below %d keys for 20s: %+v", n, ms[0])
		}
		select {
		case <-stop:
			return nil
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// migrationConfig is pool main over s0, s1, s2, with s1 served by to and, when from is
// given, migrating from it.
func migrationConfig(s0, s1, s2, from string, rate int) string {
	s1entry := fmt.Sprintf("{name: s1, addr: %q}", s1)
	if from != "" {
		s1entry = fmt.Sprintf("{name: s1, addr: %q, migrate_from: %q}", s1, from)
	}
	return fmt.Sprintf(`watch_config: false
pools:
  main:
    timeout: 2s
    migrate_rate: %d
    servers:
      - {name: s0, addr: %q}
      - %s
      - {name: s2, addr: %q}
`, rate, s0, s1entry, s2)
}

// keyModel is what the clients were told: each key's latest acknowledged version, or
// deleted. Values are "v<version>:<key>".
type keyModel struct {
	mu      sync.Mutex
	version map[string]int
	deleted map[string]bool
	acked   map[string]time.Time // when the latest write was acknowledged
}

func (m *keyModel) get(k string) (int, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.version[k], m.deleted[k]
}

func versionOf(v string) int {
	n, err := strconv.Atoi(strings.TrimPrefix(strings.SplitN(v, ":", 2)[0], "v"))
	if err != nil {
		return -1
	}
	return n
}

// TestLiveMigration moves one of three servers to a new machine by a config change while a
// writer updates 500 of its keys and deletes 200 others and a reader checks every answer.
func TestLiveMigration(t *testing.T) {
	t.Parallel() // mostly waits for instants and polls: runs beside the other such tests
	mcs, fresh, path, admin, moxi, c := migrationSetup(t)
	owner := owners(3)
	model := &keyModel{version: map[string]int{}, deleted: map[string]bool{}, acked: map[string]time.Time{}}
	var moved []string // keys of s1
	for i := range 10000 {
		k := "m:" + strconv.Itoa(i)
		if ans, err := c.set(k, "v0:"+k); err != nil || ans != "STORED" {
			t.Fatalf("set %s: %q %v", k, ans, err)
		}
		model.version[k] = 0
		if owner(k) == 1 {
			moved = append(moved, k)
		}
	}
	untouched := func(addr string) string {
		st := memcachedtest.Stats(t, addr)
		return st["cmd_set"] + "/" + st["delete_hits"] + "/" + st["delete_misses"] + "/" + st["curr_items"]
	}
	others := []string{untouched(mcs[0].Addr), untouched(mcs[2].Addr)}

	// Migrate s1 to the fresh server, slowly enough that clients work during the copy.
	if err := os.WriteFile(path, []byte(migrationConfig(mcs[0].Addr, fresh.Addr, mcs[2].Addr, mcs[1].Addr, 2000)), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, body := postReload(t, admin); code != http.StatusOK {
		t.Fatalf("reload: %d %s", code, body)
	}

	updates, deletes := moved[:500], moved[500:700]
	var stale, resurrected, reads, misses int
	var mu sync.Mutex
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(2)
	go func() { // writer
		defer wg.Done()
		w, err := dialText(moxi.addr)
		if err != nil {
			t.Error(err)
			return
		}
		defer w.Close()
		for i := range 700 {
			// Spread the writes over the copy by its progress, not the clock: every 100th
			// write waits until the copy has moved another eighth of the slot's keys.
			if i%100 == 0 {
				if err := copyReached(admin, int64(i/100)*int64(len(moved))/8, stop); err != nil {
					t.Error(err)
					return
				}
			}
			if i < 500 {
				k := updates[i]
				v, _ := model.get(k)
				if ans, err := w.set(k, fmt.Sprintf("v%d:%s", v+1, k)); err != nil || ans != "STORED" {
					t.Errorf("update %s: %q %v", k, ans, err)
					return
				}
				model.mu.Lock()
				model.version[k] = v + 1
				model.acked[k] = time.Now()
				model.mu.Unlock()
			} else {
				k := deletes[i-500]
				if ans, err := w.call("delete " + k + "\r\n"); err != nil || ans != "DELETED" {
					t.Errorf("delete %s: %q %v", k, ans, err)
					return
				}
				model.mu.Lock()
				model.deleted[k] = true
				model.acked[k] = time.Now()
				model.mu.Unlock()
			}
		}
	}()
	go func() { // reader
		defer wg.Done()
		r, err := dialText(moxi.addr)
		if err != nil {
			t.Error(err)
			return
		}
		defer r.Close()
		rng := rand.New(rand.NewPCG(1, 2))
		for i := 0; i < 200000; i++ {
			select {
			case <-stop:
				return
			default:
			}
			k := moved[rng.IntN(700)]
			before, gone := model.get(k)
			v, err := r.get(k)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			reads++
			switch {
			case v == "":
				misses++
			case gone:
				resurrected++
			case versionOf(v) < before:
				stale++
			}
			mu.Unlock()
		}
	}()

	deadline := time.Now().Add(60 * time.Second)
	var last migrationJSON
	for {
		ms := migrations(t, admin)
		if len(ms) != 1 {
			t.Fatalf("/migrations lists %d migrations: %+v", len(ms), ms)
		}
		last = ms[0]
		if last.Phase != "copying" || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	t.Logf("migration %s: %d keys copied of %d listed; reader: %d reads, %d misses, %d stale, %d deleted keys seen",
		last.Phase, last.KeysCopied, last.KeysTotal, reads, misses, stale, resurrected)
	if last.Phase != "done" {
		t.Fatalf("migration ended %q: %s", last.Phase, last.Error)
	}
	if stale > 0 || resurrected > 0 {
		t.Errorf("%d stale reads and %d reads of deleted keys during the migration", stale, resurrected)
	}

	// When the copy is done, OLD keeps no value older than one acknowledged: every write of
	// the slot sent a delete there, so that a revert, or another proxy still reading OLD,
	// cannot serve one. (Once done the slot leaves OLD alone: writes acknowledged after
	// that, which a loaded machine lets the writer make, are not checked.)
	finished, err := time.Parse(time.RFC3339Nano, last.Finished)
	if err != nil {
		t.Fatalf("finished %q: %v", last.Finished, err)
	}
	direct, err := dialText(mcs[1].Addr)
	if err != nil {
		t.Fatal(err)
	}
	older := 0
	for _, k := range moved {
		v, err := direct.get(k)
		if err != nil {
			t.Fatal(err)
		}
		model.mu.Lock()
		late := model.acked[k].After(finished)
		model.mu.Unlock()
		if want, gone := model.get(k); v != "" && !late && (gone || versionOf(v) < want) {
			older++
		}
	}
	direct.Close()
	t.Logf("when done: %d values on the old server older than the acknowledged ones", older)
	if older > 0 {
		t.Errorf("the old server holds %d values older than acknowledged writes", older)
	}

	// Then the old server goes away: every key is served from the new one, as acknowledged.
	mcs[1].Stop()
	lost, reverted, back := 0, 0, 0
	for i := range 10000 {
		k := "m:" + strconv.Itoa(i)
		v, err := c.get(k)
		if err != nil {
			t.Fatal(err)
		}
		want, gone := model.get(k)
		switch {
		case gone && v != "":
			back++
		case !gone && v == "":
			lost++
		case !gone && versionOf(v) != want:
			reverted++
		}
	}
	t.Logf("after killing the old server: %d lost, %d reverted, %d deleted keys back", lost, reverted, back)
	if lost+reverted+back > 0 {
		t.Errorf("after the migration: %d keys lost, %d reverted, %d deleted keys back", lost, reverted, back)
	}
	if now := []string{untouched(mcs[0].Addr), untouched(mcs[2].Addr)}; now[0] != others[0] || now[1] != others[1] {
		t.Errorf("the other servers were touched by the migration: %v -> %v", others, now)
	}
}

// TestMigrationRevert: putting the old address back mid-copy stops the copy, and the keys
// written during the migration are misses on the old server, never their old values.
func TestMigrationRevert(t *testing.T) {
	t.Parallel() // mostly waits for instants and polls: runs beside the other such tests
	mcs, fresh, path, admin, moxi, c := migrationSetup(t)
	before := migrationConfig(mcs[0].Addr, mcs[1].Addr, mcs[2].Addr, "", 0)
	owner := owners(3)
	var moved []string
	for i := 0; len(moved) < 2000; i++ {
		k := "rv:" + strconv.Itoa(i)
		if owner(k) != 1 {
			continue
		}
		moved = append(moved, k)
		if ans, err := c.set(k, "old"); err != nil || ans != "STORED" {
			t.Fatalf("set %s: %q %v", k, ans, err)
		}
	}
	if err := os.WriteFile(path, []byte(migrationConfig(mcs[0].Addr, fresh.Addr, mcs[2].Addr, mcs[1].Addr, 200)), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, body := postReload(t, admin); code != http.StatusOK {
		t.Fatalf("reload: %d %s", code, body)
	}
	written := moved[:100] // written through moxi during the migration: they live on the new server
	for _, k := range written {
		if ans, err := c.set(k, "new"); err != nil || ans != "STORED" {
			t.Fatalf("set %s: %q %v", k, ans, err)
		}
	}
	// Revert mid-copy: once the copy has moved a few batches, well before its end.
	if err := copyReached(admin, 60, nil); err != nil {
		t.Fatal(err)
	}
	if ms := migrations(t, admin); len(ms) != 1 || ms[0].Phase != "copying" {
		t.Fatalf("the copy of %d keys at 200 a second is not under way: %+v", len(moved), ms)
	}
	if err := os.WriteFile(path, []byte(before), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, body := postReload(t, admin); code != http.StatusOK {
		t.Fatalf("revert: %d %s", code, body)
	}
	if ms := migrations(t, admin); len(ms) != 0 {
		t.Fatalf("after the revert /migrations still lists %+v", ms)
	}
	// The copy says when it has stopped; from then on nothing may add keys to the new server.
	waitUntil(t, time.Now(), 20*time.Second, func() bool {
		return strings.Contains(moxi.out.String(), "migration copy stopped before its end")
	})
	copied := memcachedtest.Stats(t, fresh.Addr)["curr_items"]
	for _, k := range written {
		if v, err := c.get(k); err != nil || v != "" {
			t.Fatalf("%s, written during the migration, read %q %v after the revert; want a miss, never the old value", k, v, err)
		}
	}
	for _, k := range moved[100:] {
		if v, err := c.get(k); err != nil || v != "old" {
			t.Fatalf("%s, untouched by clients, read %q %v after the revert", k, v, err)
		}
	}
	// The 1,900 reads above took a while: a copy still running (it moves a batch of 20
	// keys every 100 ms) would have added keys meanwhile.
	if now := memcachedtest.Stats(t, fresh.Addr)["curr_items"]; now != copied {
		t.Errorf("the copy went on after the revert: new server items %s -> %s", copied, now)
	}
	t.Logf("reverted mid-copy with %s keys on the new server; writes made during the migration read as misses", copied)
}

// migrationSetup starts three memcached (s0, s1, s2), a fresh one to migrate s1 to, and moxi
// over the three with an admin server; it returns them, the config path and a client.
func migrationSetup(t *testing.T) (mcs []*memcachedtest.Server, fresh *memcachedtest.Server, path, admin string, moxi *process, c *textClient) {
	t.Helper()
	mcs = cluster(t, 3)
	fresh = memcachedtest.Start(t)
	path = writeConfig(t, migrationConfig(mcs[0].Addr, mcs[1].Addr, mcs[2].Addr, "", 0))
	admin = freeAddr(t)
	moxi = startMoxi(t, "--config", path, "--admin", admin)
	c, err := dialText(moxi.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return mcs, fresh, path, admin, moxi, c
}
