package test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// TestPoolsApart: two pools on two memcached, a second listener whose default pool is the
// other one, the same key names in both. Clients of both listeners read the same keys at
// the same instant, with the hot cache (hot:) and coalesced gets on: every answer is its
// own pool's value, never the other's — plain, with namespaces (each user's keys are
// "<user>:<key>" in both pools), and with every key found hot (hot_keys.cache) instead of
// a prefix. Not beside the other checks: keys turn hot by their share of the gets in a
// window, which a loaded machine's slower reads left too few for (no hot-cache answer).
func TestPoolsApart(t *testing.T) {
	for _, v := range []struct{ namespaced, absorbed bool }{{false, false}, {true, false}, {false, true}} {
		namespaced := v.namespaced
		t.Run(fmt.Sprintf("namespaces=%v,hot_keys=%v", namespaced, v.absorbed), func(t *testing.T) {
			a, b := cluster(t, 1)[0], cluster(t, 1)[0]
			second := freeAddr(t)
			auth, prefix := "", ""
			if namespaced {
				auth = fmt.Sprintf("auth:\n  users_file: %q\n  namespaces: true\n", writeUsers(t, "alice:secret"))
				prefix = "alice:"
			}
			hot := `hot_cache: {prefixes: ["hot:"], ttl: 10s}`
			if v.absorbed {
				// 200 names read alike: each takes 0.5 % of its pool's gets, over min_share.
				hot = "hot_cache: {ttl: 10s}\nhot_keys: {sample: 1, window: 2s, min_share: 0.001, cache: true}"
			}
			cfg := fmt.Sprintf(`watch_config: false
dedup: true
%s
listeners:
  - {listen: %q, default_pool: b}
pools:
  a: {timeout: 2s, servers: [%q]}
  b: {timeout: 2s, servers: [%q]}
default_pool: a
%s`, hot, second, a.Addr, b.Addr, auth)
			admin := freeAddr(t)
			moxi := startMoxi(t, "--config", writeConfig(t, cfg), "--admin", admin)
			if err := waitDial(second, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			const keys = 100
			names := make([]string, 0, 2*keys)
			for i := range keys {
				names = append(names, fmt.Sprintf("k%d", i), fmt.Sprintf("hot:k%d", i))
			}
			for _, s := range []struct{ addr, pool string }{{a.Addr, "a"}, {b.Addr, "b"}} {
				c := memcache.New(s.addr)
				for _, k := range names {
					if err := c.Set(&memcache.Item{Key: prefix + k, Value: []byte(s.pool + ":" + k)}); err != nil {
						t.Fatal(err)
					}
				}
				c.Close()
			}
			wrong, asked := readBothAtOnce(t, map[string]string{moxi.addr: "a", second: "b"}, names, namespaced)
			if asked < 10000 {
				t.Fatalf("only %d gets asked", asked)
			}
			if wrong != 0 {
				t.Fatalf("%d of %d gets answered with the other pool's value", wrong, asked)
			}
			hits := counterValue(t, admin, "moxi_hotcache_hits_total")
			t.Logf("%d gets through both listeners, 0 from the other pool; %.0f answered from the hot cache", asked, hits)
			if hits == 0 {
				t.Fatal("no get was answered from the hot cache: the test shows nothing of it")
			}
		})
	}
}

// readBothAtOnce reads every name on clients of each listener (address → its pool's name)
// at the same instant, round after round: 4 connections per listener, each sending the
// same gets (one key, then a multi-get of four) in the same order. It returns the answers
// that were not the listener's pool's value ("<pool>:<name>"), and the keys asked.
func readBothAtOnce(t *testing.T, listeners map[string]string, names []string, login bool) (wrong, asked int) {
	t.Helper()
	const perListener, rounds = 4, 5
	type client struct {
		pool string
		c    net.Conn
		r    *bufio.Reader
	}
	var clients []client
	for addr, pool := range listeners {
		for range perListener {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			r := bufio.NewReader(c)
			if login {
				textLogin(t, c, r, "alice", "secret")
			}
			clients = append(clients, client{pool, c, r})
		}
	}
	var mu sync.Mutex
	for range rounds {
		start := make(chan struct{})
		var wg sync.WaitGroup
		for _, cl := range clients {
			wg.Go(func() {
				<-start
				w, n, err := readEach(cl.c, cl.r, cl.pool, names)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					t.Error(err)
				}
				wrong += w
				asked += n
			})
		}
		close(start)
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
	}
	return wrong, asked
}

// readEach gets every name on c, one get per name and then multi-gets of four, and counts
// the values that are not pool's.
func readEach(c net.Conn, r *bufio.Reader, pool string, names []string) (wrong, asked int, err error) {
	c.SetDeadline(time.Now().Add(30 * time.Second))
	check := func(line string, want map[string]bool) error {
		for {
			l, err := r.ReadString('\n')
			if err != nil {
				return err
			}
			l = strings.TrimRight(l, "\r\n")
			if l == "END" {
				break
			}
			var key string
			var flags, n int
			if _, err := fmt.Sscanf(l, "VALUE %s %d %d", &key, &flags, &n); err != nil {
				return fmt.Errorf("%s: answered %q", line, l)
			}
			data := make([]byte, n+2)
			if _, err := io.ReadFull(r, data); err != nil {
				return err
			}
			if !want[key] {
				return fmt.Errorf("%s: unasked key %s", line, key)
			}
			delete(want, key)
			if string(data[:n]) != pool+":"+key {
				wrong++
			}
		}
		if len(want) != 0 {
			return fmt.Errorf("%s: no value for %v", line, want)
		}
		return nil
	}
	for _, k := range names {
		line := "get " + k
		if _, err := fmt.Fprintf(c, "%s\r\n", line); err != nil {
			return wrong, asked, err
		}
		asked++
		if err := check(line, map[string]bool{k: true}); err != nil {
			return wrong, asked, err
		}
	}
	for i := 0; i+4 <= len(names); i += 4 {
		line := "get " + strings.Join(names[i:i+4], " ")
		if _, err := fmt.Fprintf(c, "%s\r\n", line); err != nil {
			return wrong, asked, err
		}
		asked += 4
		want := map[string]bool{}
		for _, k := range names[i : i+4] {
			want[k] = true
		}
		if err := check(line, want); err != nil {
			return wrong, asked, err
		}
	}
	return wrong, asked, nil
}
