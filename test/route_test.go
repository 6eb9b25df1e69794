package test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// The tests of this file check GET /route against where keys really are: keys are
// written through moxi and then read directly from every memcached to find which one
// holds each (or, for reads, each server is given its own value and moxi's answer tells
// which one it read), and /route must name that server, for every key.

// routeAnswer is GET /route's JSON (docs/operating.md).
type routeAnswer struct {
	Key        string        `json:"key"`
	KeyB64     string        `json:"key_b64"`
	Pool       string        `json:"pool"`
	Server     string        `json:"server"`
	Addr       string        `json:"addr"`
	State      string        `json:"state"`
	Replicas   []routeMember `json:"replicas"`
	Zones      []routeMember `json:"zones"`
	MovingFrom string        `json:"moving_from"`
	HotCached  bool          `json:"hot_cached"`
	StandInFor string        `json:"stand_in_for"`
}

type routeMember struct {
	Zone   string `json:"zone"`
	Server string `json:"server"`
	Addr   string `json:"addr"`
	State  string `json:"state"`
}

// routeFields are the fields the contract names: every answer carries each one.
var routeFields = []string{"key", "pool", "server", "addr", "state", "replicas", "zones", "moving_from", "hot_cached", "stand_in_for"}

// routeOf is GET /route?query on admin, asked with c.
func routeOf(c *http.Client, admin, query string) (routeAnswer, error) {
	var a routeAnswer
	resp, err := c.Get("http://" + admin + "/route?" + query)
	if err != nil {
		return a, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return a, err
	}
	if resp.StatusCode != http.StatusOK {
		return a, fmt.Errorf("GET /route?%s: %d %s", query, resp.StatusCode, body)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return a, fmt.Errorf("GET /route?%s: %v: %s", query, err, body)
	}
	for _, f := range routeFields {
		if _, ok := fields[f]; !ok {
			return a, fmt.Errorf("GET /route?%s has no %q: %s", query, f, body)
		}
	}
	if string(fields["replicas"]) == "null" || string(fields["zones"]) == "null" {
		return a, fmt.Errorf("GET /route?%s: replicas and zones are lists, [] when empty: %s", query, body)
	}
	return a, json.Unmarshal(body, &a)
}

// routes asks admin's /route for each key (extra appended to each query), eight at a time
// on kept-alive connections, and returns the answers in keys' order.
func routes(t *testing.T, admin string, keys []string, extra string) []routeAnswer {
	t.Helper()
	const workers = 8
	tr := &http.Transport{MaxIdleConnsPerHost: workers}
	defer tr.CloseIdleConnections()
	c := &http.Client{Timeout: 10 * time.Second, Transport: tr}
	out := make([]routeAnswer, len(keys))
	var next atomic.Int64
	var first sync.Once
	var failure error
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(keys); i = int(next.Add(1) - 1) {
				a, err := routeOf(c, admin, "key="+url.QueryEscape(keys[i])+extra)
				if err != nil {
					first.Do(func() { failure = err })
					return
				}
				out[i] = a
			}
		})
	}
	wg.Wait()
	if failure != nil {
		t.Fatal(failure)
	}
	return out
}

// setVia sets every key to value on the connection (moxi's or a memcached's), 500 sets
// pipelined at a time.
func setVia(t *testing.T, c net.Conn, r *bufio.Reader, keys []string, value string) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	for start := 0; start < len(keys); start += 500 {
		chunk := keys[start:min(start+500, len(keys))]
		var b strings.Builder
		for _, k := range chunk {
			fmt.Fprintf(&b, "set %s 0 0 %d\r\n%s\r\n", k, len(value), value)
		}
		if _, err := c.Write([]byte(b.String())); err != nil {
			t.Fatal(err)
		}
		for _, k := range chunk {
			if line, err := r.ReadString('\n'); err != nil || line != "STORED\r\n" {
				t.Fatalf("set %s: %q %v", k, line, err)
			}
		}
	}
}

// getVia reads keys on the connection, 500 to a get: the values found.
func getVia(t *testing.T, c net.Conn, r *bufio.Reader, keys []string) map[string]string {
	t.Helper()
	out := make(map[string]string, len(keys))
	for start := 0; start < len(keys); start += 500 {
		lines := roundTrip(t, c, r, "get "+strings.Join(keys[start:min(start+500, len(keys))], " ")+"\r\n", "END")
		for i := 0; i+1 < len(lines); i++ {
			if f := strings.Fields(lines[i]); len(f) == 4 && f[0] == "VALUE" {
				out[f[1]] = lines[i+1]
				i++
			}
		}
	}
	return out
}

// holderAddrs is, for each key, the addresses of the servers of mcs that hold it.
func holderAddrs(t *testing.T, mcs []*memcachedtest.Server, keys []string) [][]string {
	t.Helper()
	out := make([][]string, len(keys))
	for i, hs := range holders(t, mcs, keys) {
		for _, s := range hs {
			out[i] = append(out[i], mcs[s].Addr)
		}
	}
	return out
}

// serverNames maps each server's address to the name the config gives it: prefix<i>.
func serverNames(names map[string]string, prefix string, mcs []*memcachedtest.Server) {
	for i, mc := range mcs {
		names[mc.Addr] = fmt.Sprintf("%s%d", prefix, i)
	}
}

// checkPlaced checks that the answer for each key names the one server that holds it
// (held, its holders), in pool, by its name (names by address), up, with no copies,
// move or stand-in; it logs how the keys spread over the servers.
func checkPlaced(t *testing.T, what, pool string, keys []string, got []routeAnswer, held [][]string, names map[string]string) {
	t.Helper()
	bad := 0
	spread := map[string]int{}
	for i, k := range keys {
		a := got[i]
		spread[a.Server]++
		ok := len(held[i]) == 1 && a.Key == k && a.Pool == pool && a.Addr == held[i][0] && a.Server == names[a.Addr] &&
			a.State == "up" && len(a.Replicas) == 0 && len(a.Zones) == 0 && a.MovingFrom == "" && a.StandInFor == ""
		if !ok {
			if bad++; bad <= 5 {
				t.Errorf("%s: %s is held by %v; /route says %+v", what, k, held[i], a)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%s: /route disagrees with the servers for %d of %d keys", what, bad, len(keys))
	}
	t.Logf("%s: %d keys, /route agrees with where each one is; spread %v", what, len(keys), spread)
}

// numbered is n keys format(i).
func numbered(n int, format string) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf(format, i)
	}
	return keys
}

// TestRouteKeys: one moxi with a ketama pool (the default), a jump pool and a hash_tag
// pool behind prefix routes, and a second listener whose default pool is a fourth pool.
// Keys are written through moxi's listeners and found on the servers directly; /route
// names each key's server: 10,000 keys of the ketama pool, 2,000 of each of the others.
// Keys sharing a hash tag share a server. The hot cache's answer agrees with hot_cached.
func TestRouteKeys(t *testing.T) {
	t.Parallel() // placements compared, nothing timed: beside the waiting checks
	mcs := cluster(t, 11)
	mainMCs, jumpMCs, tagMCs, spareMCs := mcs[0:3], mcs[3:6], mcs[6:9], mcs[9:11]
	second, admin := freeAddr(t), freeAddr(t)
	var b strings.Builder
	fmt.Fprintf(&b, "watch_config: false\nlisteners:\n  - listen: %s\n    default_pool: spare\n", second)
	b.WriteString("hot_cache:\n  prefixes: [\"hot:\"]\n  ttl: 60s\n")
	b.WriteString("routes:\n  - prefix: \"j:\"\n    pool: jumpy\n  - prefix: \"t:\"\n    pool: tagged\ndefault_pool: main\npools:\n")
	names := map[string]string{}
	addPool := func(name, settings string, servers []*memcachedtest.Server) {
		fmt.Fprintf(&b, "  %s:\n    timeout: 2s\n%s    servers:\n", name, settings)
		for i, mc := range servers {
			fmt.Fprintf(&b, "      - {name: %s%d, addr: %q}\n", name, i, mc.Addr)
		}
		serverNames(names, name, servers)
	}
	addPool("main", "", mainMCs)
	addPool("jumpy", "    distribution: jump\n", jumpMCs)
	addPool("tagged", "    hash_tag: \"{}\"\n", tagMCs)
	addPool("spare", "", spareMCs)
	moxi := startMoxi(t, "--config", writeConfig(t, b.String()), "--admin", admin)
	if err := memcachedtest.WaitListening(second, 20*time.Second); err != nil {
		t.Fatal(err)
	}

	mainKeys := numbered(10000, "key:%d")
	jumpKeys := numbered(2000, "j:%d")
	var tagKeys []string
	for i := range 2000 {
		tagKeys = append(tagKeys, fmt.Sprintf("t:{user%d}:field%d", i/5, i%5))
	}
	spareKeys := numbered(2000, "l:%d")    // through the second listener: its default pool
	routedKeys := numbered(200, "j:via%d") // through the second listener, routed as on the first
	c, r := dialConn(t, moxi.addr)
	for _, keys := range [][]string{mainKeys, jumpKeys, tagKeys} {
		setVia(t, c, r, keys, "1")
	}
	c2, r2 := dialConn(t, second)
	setVia(t, c2, r2, spareKeys, "1")
	setVia(t, c2, r2, routedKeys, "1")

	start := time.Now()
	checkPlaced(t, "ketama", "main", mainKeys, routes(t, admin, mainKeys, ""), holderAddrs(t, mcs, mainKeys), names)
	t.Logf("10,000 keys' /route asked and checked in %v", time.Since(start).Round(time.Millisecond))
	checkPlaced(t, "jump", "jumpy", jumpKeys, routes(t, admin, jumpKeys, ""), holderAddrs(t, mcs, jumpKeys), names)
	tagged := routes(t, admin, tagKeys, "")
	checkPlaced(t, "hash_tag", "tagged", tagKeys, tagged, holderAddrs(t, mcs, tagKeys), names)
	for i := 0; i < len(tagKeys); i += 5 {
		for j := i + 1; j < i+5; j++ {
			if tagged[j].Addr != tagged[i].Addr {
				t.Errorf("%s and %s share a hash tag, /route puts them on %s and %s", tagKeys[i], tagKeys[j], tagged[i].Addr, tagged[j].Addr)
			}
		}
	}
	spareView := routes(t, admin, spareKeys, "&listener="+url.QueryEscape(second))
	checkPlaced(t, "second listener", "spare", spareKeys, spareView, holderAddrs(t, mcs, spareKeys), names)
	checkPlaced(t, "second listener, prefix route", "jumpy", routedKeys, routes(t, admin, routedKeys, "&listener="+url.QueryEscape(second)),
		holderAddrs(t, mcs, routedKeys), names)
	// The same keys, asked as the first listener's clients would send them: the default pool.
	for i, a := range routes(t, admin, spareKeys[:200], "") {
		if a.Pool != "main" {
			t.Errorf("%s on the main listener: pool %q, want main (the second listener's is %q)", spareKeys[i], a.Pool, spareView[i].Pool)
			break
		}
	}
	if code, body := adminDo(t, "GET", "http://"+admin+"/route?key=a&listener=127.0.0.1:1", ""); code != http.StatusBadRequest {
		t.Errorf("/route for a listener moxi does not have: %d %s, want 400", code, body)
	}

	// The hot cache: 60 hot keys read through moxi (cached), 10 of them then written
	// through it (dropped), 40 never read. Each server is then given another value behind
	// moxi's back: a read answers the old value exactly when the hot cache holds the key.
	hot := numbered(100, "hot:%d")
	setVia(t, c, r, hot, "old")
	tc, err := dialText(moxi.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	for _, k := range hot[:60] {
		if v, err := tc.get(k); err != nil || v != "old" {
			t.Fatalf("get %s: %q %v", k, v, err)
		}
	}
	setVia(t, c, r, hot[:10], "old")
	for _, mc := range mainMCs {
		d, dr := dialConn(t, mc.Addr)
		setVia(t, d, dr, hot, "new")
	}
	cachedHot, bad := 0, 0
	for i, a := range routes(t, admin, hot, "") {
		v, err := tc.get(hot[i])
		if err != nil || (v == "old") != a.HotCached {
			if bad++; bad <= 5 {
				t.Errorf("%s: /route says hot_cached %v, a read through moxi answers %q %v", hot[i], a.HotCached, v, err)
			}
		}
		if a.HotCached {
			cachedHot++
		}
	}
	if cachedHot == 0 || cachedHot > 50 {
		t.Errorf("%d hot keys cached, want 1 to 50 (50 read and not written since)", cachedHot)
	}
	t.Logf("hot cache: %d of 100 keys held, and /route's hot_cached agrees with the answer of a read for each", cachedHot)
}

// TestRouteNamespaces: with auth.namespaces, two users write the same keys; each user's
// keys are found on the servers as "<user>:<key>", and /route?key=K&user=U names the
// server of U's copy, in the pool the client's key routes to. Without a user: 400.
func TestRouteNamespaces(t *testing.T) {
	users := writeUsers(t, "alice:secret", "bob:builder")
	mcs := cluster(t, 5)
	extra := fmt.Sprintf("  other:\n    servers: [%q, %q]\nroutes:\n  - prefix: \"r:\"\n    pool: other\ndefault_pool: main\n", mcs[3].Addr, mcs[4].Addr)
	admin := freeAddr(t)
	moxi := startMoxi(t, "--config", writeConfig(t, authConfig(users, true, extra, addrs(mcs[:3])...)), "--admin", admin)
	keys := append(numbered(1500, "k:%d"), numbered(500, "r:%d")...)
	names := map[string]string{}
	for _, mc := range mcs {
		names[mc.Addr] = mc.Addr // unnamed: the ring name is the address
	}
	apart := 0
	var views [][]routeAnswer
	for _, u := range []struct{ name, password string }{{"alice", "secret"}, {"bob", "builder"}} {
		c, r := dialConn(t, moxi.addr)
		textLogin(t, c, r, u.name, u.password)
		setVia(t, c, r, keys, u.name)
		stored := make([]string, len(keys))
		for i, k := range keys {
			stored[i] = u.name + ":" + k
		}
		got := routes(t, admin, keys, "&user="+u.name)
		held := holderAddrs(t, mcs, stored)
		checkPlaced(t, u.name+"'s keys", "main", keys[:1500], got[:1500], held[:1500], names)
		checkPlaced(t, u.name+"'s routed keys", "other", keys[1500:], got[1500:], held[1500:], names)
		views = append(views, got)
	}
	for i := range keys {
		if views[0][i].Addr != views[1][i].Addr {
			apart++
		}
	}
	if apart == 0 {
		t.Error("alice's and bob's copies of every key are on one server: the user is not part of the placement")
	}
	t.Logf("alice's and bob's copies of %d of %d keys are on different servers", apart, len(keys))
	if code, body := adminDo(t, "GET", "http://"+admin+"/route?key=k:1", ""); code != http.StatusBadRequest || !strings.Contains(body, "namespaces") {
		t.Errorf("/route without a user, with namespaces: %d %s, want 400 saying why", code, body)
	}
}

// checkMoving checks /route's answers (got) while keys move, against where each key was
// before the change (before: one holder each) and where it is once read through moxi
// (after): a key /route says is moving comes from its old server (moving_from) to another
// one (addr), which holds it once read; any other key stays on its server. It returns the
// indexes of the moving keys.
func checkMoving(t *testing.T, keys []string, before [][]string, got []routeAnswer, after func() [][]string) []int {
	t.Helper()
	var moving []int
	bad := 0
	fail := func(format string, args ...any) {
		if bad++; bad <= 5 {
			t.Errorf(format, args...)
		}
	}
	for i, k := range keys {
		a := got[i]
		switch {
		case len(before[i]) != 1:
			fail("%s: held by %v before the change, want one server", k, before[i])
		case a.MovingFrom == "" && a.Addr != before[i][0]:
			fail("%s: /route puts it on %s, not moving, but it is on %s", k, a.Addr, before[i][0])
		case a.MovingFrom != "" && (a.MovingFrom != before[i][0] || a.Addr == before[i][0]):
			fail("%s: /route says it moves from %s to %s, but it was on %s", k, a.MovingFrom, a.Addr, before[i][0])
		case a.MovingFrom != "":
			moving = append(moving, i)
		}
	}
	// A read copies a moving key to its new server after answering: wait for the copies.
	var lacking []int
	poll(10*time.Second, func() bool {
		held := after()
		lacking = lacking[:0]
		for i := range keys {
			if !slices.Contains(held[i], got[i].Addr) {
				lacking = append(lacking, i)
			}
		}
		return len(lacking) == 0
	})
	for _, i := range lacking {
		fail("%s: /route puts it on %s, which does not hold it once read through moxi", keys[i], got[i].Addr)
	}
	if bad > 0 {
		t.Errorf("/route disagrees with the servers for %d of %d keys", bad, len(keys))
	}
	return moving
}

// readAll reads every key through moxi; each must hit.
func readAll(t *testing.T, moxi string, keys []string) {
	t.Helper()
	c, r := dialConn(t, moxi)
	if got := getVia(t, c, r, keys); len(got) != len(keys) {
		t.Errorf("%d of %d keys read through moxi during the move; want every one", len(got), len(keys))
	}
}

// TestRouteReshard: a server added by reload to a pool of three, the copy slowed to a key a
// second so that keys are still moving: /route says which keys move (moving_from: the
// server that held each, addr: the new one) and which stay, and a read through moxi
// brings each moving key to the server /route named.
func TestRouteReshard(t *testing.T) {
	t.Parallel() // mostly waits for copies and polls: runs beside the other such tests
	mcs := cluster(t, 4)
	const slow = "    migrate_rate: 1\n"
	path, admin := writeConfig(t, reshardConfigWith(slow, mcs, "", 0, 1, 2)), freeAddr(t)
	moxi := startMoxi(t, "--config", path, "--admin", admin)
	keys := numbered(3000, "rs:%d")
	setKeys(t, moxi.addr, keys)
	before := holderAddrs(t, mcs, keys)
	reloadFile(t, path, admin, reshardConfigWith(slow, mcs, "", 0, 1, 2, 3))
	got := routes(t, admin, keys, "")
	readAll(t, moxi.addr, keys)
	moving := checkMoving(t, keys, before, got, func() [][]string { return holderAddrs(t, mcs, keys) })
	for _, i := range moving {
		if a := got[i]; a.Addr != mcs[3].Addr || a.Server != "s3" || a.State != "up" {
			t.Errorf("%s moves to %s (%s, %s): a server added to a ketama ring takes keys, the others keep theirs", keys[i], a.Server, a.Addr, a.State)
			break
		}
	}
	if len(moving) == 0 || len(moving) == len(keys) {
		t.Errorf("%d of %d keys moving: want some (about a quarter)", len(moving), len(keys))
	}
	t.Logf("reshard: %d of %d keys moving to s3, each from the server that held it; /route agrees for every key", len(moving), len(keys))
}

// TestRouteMigration: s1 migrates (migrate_from) to a fresh server, its copy slowed to a
// key a second: /route puts s1's keys on the fresh server, state migrating, moving from
// s1's old address; every other key stays; a read through moxi brings s1's keys over.
func TestRouteMigration(t *testing.T) {
	t.Parallel() // mostly waits for copies and polls: runs beside the other such tests
	mcs := cluster(t, 3)
	fresh := memcachedtest.Start(t)
	all := append(slices.Clone(mcs), fresh)
	path, admin := writeConfig(t, migrationConfig(mcs[0].Addr, mcs[1].Addr, mcs[2].Addr, "", 1)), freeAddr(t)
	moxi := startMoxi(t, "--config", path, "--admin", admin)
	keys := numbered(3000, "mg:%d")
	setKeys(t, moxi.addr, keys)
	before := holderAddrs(t, all, keys)
	reloadFile(t, path, admin, migrationConfig(mcs[0].Addr, fresh.Addr, mcs[2].Addr, mcs[1].Addr, 1))
	got := routes(t, admin, keys, "")
	readAll(t, moxi.addr, keys)
	moving := checkMoving(t, keys, before, got, func() [][]string { return holderAddrs(t, all, keys) })
	n := 0
	for i, k := range keys {
		a, wasS1 := got[i], before[i][0] == mcs[1].Addr
		if wasS1 {
			n++
		}
		if wasS1 != slices.Contains(moving, i) || wasS1 && (a.Server != "s1" || a.Addr != fresh.Addr || a.State != "migrating") {
			t.Errorf("%s, on %s before the migration of s1 from %s: /route says %+v", k, before[i][0], mcs[1].Addr, a)
			break
		}
	}
	if n == 0 {
		t.Error("no key of s1: the test tests nothing")
	}
	t.Logf("migration: %d of %d keys (s1's) moving from %s, state migrating; /route agrees for every key", len(moving), len(keys), mcs[1].Addr)
}

// TestRouteFailover: s0 killed and marked dead, keys written through moxi: /route names,
// for each of s0's keys, the stand-in that took its write as server and s0 as stand_in_for,
// and every other key's own server.
func TestRouteFailover(t *testing.T) {
	t.Parallel() // mostly waits for s0 to be marked dead: runs beside the other such tests
	mcs := cluster(t, 3)
	admin := freeAddr(t)
	moxi := startMoxi(t, "--config", writeConfig(t, resilientConfig(true, addrs(mcs)...)), "--admin", admin)
	tc, err := dialText(moxi.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	mine, _ := keysOf(0, 3, 1)
	mcs[0].Stop()
	waitUntil(t, time.Now(), 30*time.Second, func() bool { // s0 marked dead: its keys go to stand-ins
		ans, err := tc.set(mine[0], "x")
		return err == nil && ans == "STORED"
	})
	keys := numbered(3000, "fo:%d")
	setKeys(t, moxi.addr, keys)
	held := holderAddrs(t, mcs[1:], keys)
	got := routes(t, admin, keys, "")
	owner := owners(3)
	names := map[string]string{mcs[1].Addr: "s1", mcs[2].Addr: "s2"}
	standIns, bad := 0, 0
	for i, k := range keys {
		a := got[i]
		want := ""
		if owner(k) == 0 {
			want, standIns = "s0", standIns+1
		}
		if len(held[i]) != 1 || a.Addr != held[i][0] || a.Server != names[a.Addr] || a.State != "up" || a.StandInFor != want {
			if bad++; bad <= 5 {
				t.Errorf("%s (owner s%d) is held by %v; /route says %+v", k, owner(k), held[i], a)
			}
		}
	}
	if bad > 0 || standIns == 0 {
		t.Errorf("/route disagrees with where moxi's writes went for %d of %d keys (%d of them s0's)", bad, len(keys), standIns)
	}
	t.Logf("failover: %d of %d keys are s0's, each written to the stand-in /route names, with stand_in_for s0", standIns, len(keys))
}

// TestRouteCopies: with replicas: 2, /route's server and replicas are the two servers that
// hold each key, and a read through moxi answers from its server; with two zones, its
// zones are the server of each zone that holds the key, and a read answers from the
// proxy's own zone's.
func TestRouteCopies(t *testing.T) {
	t.Parallel() // two proxies and their servers: runs beside the other such tests
	keys := numbered(2000, "cp:%d")
	// ownValues gives each server of mcs its own value of the keys it holds, and returns
	// what a read of each key through moxi answers: the address of the server it read.
	ownValues := func(mcs []*memcachedtest.Server, moxi string) map[string]string {
		for _, mc := range mcs {
			c, r := dialConn(t, mc.Addr)
			var mine []string
			for k := range heldValues(t, mc, keys) {
				mine = append(mine, k)
			}
			setVia(t, c, r, mine, mc.Addr)
		}
		c, r := dialConn(t, moxi)
		return getVia(t, c, r, keys)
	}

	t.Run("replicas", func(t *testing.T) {
		mcs := cluster(t, 3)
		admin := freeAddr(t)
		moxi := startMoxi(t, "--config", writeConfig(t, poolConfig("    replicas: 2\n", addrs(mcs)...)), "--admin", admin)
		setKeys(t, moxi.addr, keys)
		held := holderAddrs(t, mcs, keys)
		got := routes(t, admin, keys, "")
		read := ownValues(mcs, moxi.addr)
		bad := 0
		for i, k := range keys {
			a := got[i]
			copies := []string{a.Addr}
			for _, m := range a.Replicas {
				copies = append(copies, m.Addr)
			}
			slices.Sort(copies)
			slices.Sort(held[i])
			if !slices.Equal(copies, held[i]) || len(a.Replicas) != 1 || len(a.Zones) != 0 || read[k] != a.Addr {
				if bad++; bad <= 5 {
					t.Errorf("%s is held by %v and read from %s; /route says %+v", k, held[i], read[k], a)
				}
			}
		}
		if bad > 0 {
			t.Errorf("/route disagrees with the servers for %d of %d keys", bad, len(keys))
		}
		t.Logf("replicas: 2: for %d keys, server and replicas are the two holders, and reads answer from server", len(keys))
	})

	t.Run("zones", func(t *testing.T) {
		mcs := cluster(t, 4)
		nameOf := map[string]string{mcs[0].Addr: "a/a0", mcs[1].Addr: "a/a1", mcs[2].Addr: "b/b0", mcs[3].Addr: "b/b1"} // "<zone>/<name>"
		admin := freeAddr(t)
		cfg := zonesConfig("b", "    timeout: 2s\n", []string{mcs[0].Addr, mcs[1].Addr}, []string{mcs[2].Addr, mcs[3].Addr})
		moxi := startMoxi(t, "--config", writeConfig(t, cfg), "--admin", admin)
		setKeys(t, moxi.addr, keys)
		held := holderAddrs(t, mcs, keys)
		got := routes(t, admin, keys, "")
		read := ownValues(mcs, moxi.addr)
		bad := 0
		for i, k := range keys {
			a := got[i]
			var copies []string
			zonesOK := len(a.Zones) == 2 && len(a.Replicas) == 0
			for z, m := range a.Zones {
				copies = append(copies, m.Addr)
				zonesOK = zonesOK && m.Zone == zoneNames[z] && nameOf[m.Addr] == m.Server && strings.HasPrefix(m.Server, m.Zone+"/")
			}
			slices.Sort(copies)
			slices.Sort(held[i])
			local := ""
			if len(a.Zones) == 2 {
				local = a.Zones[1].Addr // the proxy's zone is b
			}
			if !zonesOK || !slices.Equal(copies, held[i]) || !slices.Contains(copies, a.Addr) || read[k] != local {
				if bad++; bad <= 5 {
					t.Errorf("%s is held by %v and read from %s; /route says %+v", k, held[i], read[k], a)
				}
			}
		}
		if bad > 0 {
			t.Errorf("/route disagrees with the servers for %d of %d keys", bad, len(keys))
		}
		t.Logf("zones a, b: for %d keys, zones name each zone's holder, and reads answer from zone b's", len(keys))
	})
}
