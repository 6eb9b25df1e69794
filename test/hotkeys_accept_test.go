//go:build accept

package test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// The acceptance figures of hot_keys and the hot cache (docs/operating.md, "Hot keys"), on
// real memcached and the suite's moxi, under pipelined load. Every figure measured is
// logged.

// hkaConn is a text connection that pipelines: a batch of requests in one write, then their
// answers in order.
type hkaConn struct {
	c   net.Conn
	r   *bufio.Reader
	out []byte
}

func hkaDial(addr string) (*hkaConn, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	return &hkaConn{c: c, r: bufio.NewReaderSize(c, 64<<10)}, nil
}

func (h *hkaConn) Close() error { return h.c.Close() }

// gets sends "get k\r\n" for every key of keys in one write and reads their answers; vals,
// when not nil, receives each value ("" for a miss).
func (h *hkaConn) gets(keys []string, vals []string) error {
	h.out = h.out[:0]
	for _, k := range keys {
		h.out = append(append(append(h.out, "get "...), k...), "\r\n"...)
	}
	_ = h.c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := h.c.Write(h.out); err != nil {
		return err
	}
	for i, k := range keys {
		v, err := h.answer(k, vals != nil)
		if err != nil {
			return err
		}
		if vals != nil {
			vals[i] = v
		}
	}
	return nil
}

// answer reads one get's answer for key: its value (when keep), or "" for a miss.
func (h *hkaConn) answer(key string, keep bool) (string, error) {
	line, err := h.r.ReadSlice('\n')
	if err != nil {
		return "", fmt.Errorf("get %s: %w", key, err)
	}
	if string(line) == "END\r\n" {
		return "", nil
	}
	f := bytes.Fields(line)
	if len(f) != 4 || string(f[0]) != "VALUE" || string(f[1]) != key {
		return "", fmt.Errorf("get %s answered %q", key, line)
	}
	n, err := strconv.Atoi(string(f[3]))
	if err != nil {
		return "", fmt.Errorf("get %s answered %q", key, line)
	}
	var v string
	if keep {
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(h.r, buf); err != nil {
			return "", fmt.Errorf("get %s: %w", key, err)
		}
		v = string(buf[:n])
	} else if _, err := h.r.Discard(n + 2); err != nil {
		return "", fmt.Errorf("get %s: %w", key, err)
	}
	end, err := h.r.ReadSlice('\n')
	if err != nil || string(end) != "END\r\n" {
		return "", fmt.Errorf("get %s: after the value %q, %v", key, end, err)
	}
	return v, nil
}

// sets stores vals[i] as keys[i], all in one write, and checks that each is STORED.
func (h *hkaConn) sets(keys, vals []string) error {
	h.out = h.out[:0]
	for i, k := range keys {
		h.out = fmt.Appendf(h.out, "set %s 0 0 %d\r\n%s\r\n", k, len(vals[i]), vals[i])
	}
	_ = h.c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := h.c.Write(h.out); err != nil {
		return err
	}
	for _, k := range keys {
		line, err := h.r.ReadSlice('\n')
		if err != nil {
			return fmt.Errorf("set %s: %w", k, err)
		}
		if string(line) != "STORED\r\n" {
			return fmt.Errorf("set %s answered %q", k, line)
		}
	}
	return nil
}

// hkaMaxBatches bounds each pipelining client's batches, whatever the machine's speed.
const hkaMaxBatches = 1_000_000

// TestAcceptHotKeysZipf: 8 pipelining clients get keys drawn from a Zipf law (s = 1.1) over
// 1,000,000 keys, as fast as they can (the aim is ≥ 20,000 gets/s). Within two windows of
// the load starting, GET /hotkeys lists every key whose true share of the gets (the
// clients' own counts) is ≥ 1.5 %, none whose true share is < 0.5 %, and each listed key's
// share within ±25 % of its true share; and it keeps doing so until three windows after.
//
// The settings: min_share 0.01, so a key turns hot from an estimated 1 % — every key of
// 1.5 % does, with room for the estimate's error — and cools below 0.5 %: a key of less
// than 0.5 % cannot turn hot in steady state (its estimate would have to double), and one
// that a startup fluctuation made hot (a few samples, when the window holds ~1,000) cools
// at the first rescan that sees it below 0.5 %. sample 1 counts every get, so that the
// shares' sampling noise is a few percent: the ±25 % is then the sketch's accuracy, not
// luck. With P(k) ∝ (k+1)^-1.1, k < 10^6: 6 keys are ≥ 1.5 % (the 7th is 1.46 %), 18 are
// ≥ 0.5 %.
func TestAcceptHotKeysZipf(t *testing.T) {
	const (
		nkeys     = 1_000_000
		clients   = 8
		batch     = 16
		window    = 5 * time.Second
		mustList  = 0.015 // every key at least this hot is listed
		mayList   = 0.005 // no key below this is listed
		tolerance = 0.25  // a listed share within ±25 % of the true share
		aimRate   = 20_000
	)
	mc := cluster(t, 1)[0]
	admin := freeAddr(t)
	moxi := startMoxi(t, "--admin", admin, "--config", writeConfig(t, fmt.Sprintf(`watch_config: false
hot_keys: {window: %v, sample: 1, min_share: 0.01}
pools:
  main:
    timeout: 5s
    servers: [{name: only, addr: %q}]
`, window, mc.Addr)))

	counts := make([]atomic.Int64, nkeys) // gets sent, per key
	var total atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for w := range clients {
		wg.Go(func() {
			c, err := hkaDial(moxi.addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			z := rand.NewZipf(rand.New(rand.NewPCG(uint64(w)+1, 0x2a)), 1.1, 1, nkeys-1)
			keys := make([]string, batch)
			for range hkaMaxBatches {
				select {
				case <-stop:
					return
				default:
				}
				for i := range keys {
					k := z.Uint64()
					counts[k].Add(1)
					keys[i] = "z:" + strconv.FormatUint(k, 10)
				}
				total.Add(batch)
				if err := c.gets(keys, nil); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	stopLoad := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopLoad()

	type verdict struct {
		ok       bool
		problems []string
		table    []string // listed key: share vs true share
		n        int64
	}
	judge := func(list []hotKeyLine) verdict {
		v := verdict{n: total.Load()}
		if v.n == 0 {
			return verdict{problems: []string{"no get sent yet"}}
		}
		listed := map[string]bool{}
		for _, l := range list {
			listed[l.Key] = true
			k, err := strconv.Atoi(strings.TrimPrefix(l.Key, "z:"))
			if err != nil || k < 0 || k >= nkeys || l.Pool != "main" || l.Server != "only" {
				v.problems = append(v.problems, fmt.Sprintf("listed %+v", l))
				continue
			}
			truth := float64(counts[k].Load()) / float64(v.n)
			v.table = append(v.table, fmt.Sprintf("%s %.4f (true %.4f, %+.1f %%)", l.Key, l.Share, truth, 100*(l.Share/truth-1)))
			switch {
			case truth < mayList:
				v.problems = append(v.problems, fmt.Sprintf("%s listed with true share %.4f < %.3f", l.Key, truth, mayList))
			case math.Abs(l.Share/truth-1) > tolerance:
				v.problems = append(v.problems, fmt.Sprintf("%s listed share %.4f, true share %.4f: off by more than 25 %%", l.Key, l.Share, truth))
			}
		}
		for k := range nkeys {
			if truth := float64(counts[k].Load()) / float64(v.n); truth >= mustList && !listed["z:"+strconv.Itoa(k)] {
				v.problems = append(v.problems, fmt.Sprintf("z:%d (true share %.4f) not listed", k, truth))
			}
		}
		v.ok = len(v.problems) == 0
		return v
	}

	// Within two windows of the load starting, the list is right.
	var first verdict
	var firstAt time.Duration
	for {
		time.Sleep(250 * time.Millisecond)
		first, firstAt = judge(hotKeys(t, admin)), time.Since(start)
		if first.ok || firstAt > 2*window {
			break
		}
	}
	if !first.ok {
		stopLoad()
		t.Fatalf("after %v (%d gets), GET /hotkeys is still wrong: %v\nlisted: %v", firstAt.Round(time.Millisecond), first.n, first.problems, first.table)
	}
	t.Logf("GET /hotkeys right %v after the load started (%d gets sent): %s", firstAt.Round(time.Millisecond), first.n, strings.Join(first.table, "; "))

	// And it stays right, through the second window and a further one.
	var polls, wrong int
	var last verdict
	var wrongs []string
	for end := start.Add(3 * window); time.Now().Before(end); {
		time.Sleep(250 * time.Millisecond)
		last = judge(hotKeys(t, admin))
		polls++
		if !last.ok {
			wrong++
			if len(wrongs) < 5 {
				wrongs = append(wrongs, fmt.Sprint(last.problems))
			}
		}
	}
	share := metricValue(t, admin, `moxi_hot_key_share{pool="main"}`)
	n, elapsed := total.Load(), time.Since(start)
	stopLoad()
	rate := float64(n) / elapsed.Seconds()
	top := float64(counts[0].Load()) / float64(n)
	t.Logf("Zipf(1.1) over %d keys from %d clients (batches of %d): %d gets in %v, %.0f gets/s (aim %d)",
		nkeys, clients, batch, n, elapsed.Round(time.Millisecond), rate, aimRate)
	t.Logf("from then until 3 windows after the load started: %d polls of GET /hotkeys, %d wrong; the last: %s", polls, wrong, strings.Join(last.table, "; "))
	t.Logf("moxi_hot_key_share{pool=\"main\"} %.4f, z:0's true share %.4f", share, top)
	if rate < aimRate {
		t.Logf("NOTE: %.0f gets/s is below the aim of %d gets/s on this machine (moxi built with -race); the accuracy figures above hold at that rate", rate, aimRate)
	}
	if wrong > 0 {
		t.Errorf("%d of %d polls after GET /hotkeys was first right were wrong: %v", wrong, polls, wrongs)
	}
	if math.Abs(share/top-1) > tolerance {
		t.Errorf("moxi_hot_key_share %.4f, the hottest key's true share %.4f", share, top)
	}
}

// TestAcceptHotKeyAbsorbed50k: one key, hot:x, takes 30 % of 50,000 gets/s (8 pipelining
// clients, paced), with hot_keys.cache and no hot_cache prefix. It is found hot within 2 s
// of its first request; from then on, over 10 s, its server sees at most 1 % of its gets —
// counting both what fills the hot cache, a get and an expiry ask ("mg hot:x t") each —
// while a writer sets rising versions of it through the same moxi every 100 ms (each write
// drops the entry, so about 10 fills a second); and no read of it returns a version older
// than the newest acknowledged before its get was sent.
//
// The server's count: memcached's get_hits, since hot:x is the only key that exists (the
// other keys, 10,000 of them, miss), so that its hits are the gets and the mg asks of
// hot:x; "stats detail" (gets only: memcached does not count mg there) is logged beside it.
//
// The moxi is built without the race detector: on a 2-core machine the race build tops out
// near 24,000 gets/s under this load, half the rate the figure is stated at, and what
// reaches the server is per write (the gets that miss between the write and the next fill,
// a few, each a get and an mg), so that its fraction of the key's gets depends on the rate.
// (TestHotKeyAbsorbed checks the same path on the race build, at its own rate.)
func TestAcceptHotKeyAbsorbed50k(t *testing.T) {
	const (
		clients  = 8
		batch    = 16
		pHot     = 0.3
		cold     = 10_000
		measure  = 10 * time.Second
		aimRate  = 50_000
		maxShare = 0.01
	)
	mc := detailedMemcached(t)
	admin := freeAddr(t)
	moxi := startMoxiBin(t, fastMoxi(t), "--admin", admin, "--config", writeConfig(t, fmt.Sprintf(`watch_config: false
hot_cache: {ttl: 2s}
hot_keys: {sample: 0.1, window: 2s, min_share: 0.05, cache: true}
pools:
  main:
    timeout: 5s
    servers: [{name: only, addr: %q}]
`, mc.Addr)))

	w, err := dialText(moxi.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var newest atomic.Int64 // the newest version acknowledged
	var writeErr atomic.Value
	write := func(v int64) bool {
		if ans, err := w.set("hot:x", strconv.FormatInt(v, 10)); err != nil || ans != "STORED" {
			writeErr.Store(fmt.Sprintf("set hot:x %d: %q %v", v, ans, err))
			return false
		}
		newest.Store(v)
		return true
	}
	if !write(1) {
		t.Fatal(writeErr.Load())
	}

	var all, hot, reads, stale atomic.Int64
	var firstHot atomic.Int64 // unix nanoseconds of the first get of hot:x sent
	var exMu sync.Mutex
	var examples []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for c := range clients {
		wg.Go(func() {
			conn, err := hkaDial(moxi.addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			r := rand.New(rand.NewPCG(uint64(c)+1, 0x407))
			keys, vals := make([]string, batch), make([]string, batch)
			// Batch b is sent no sooner than b·every after the start: aimRate in all.
			every := time.Duration(float64(time.Second) * clients * batch / aimRate)
			for b := range hkaMaxBatches {
				select {
				case <-stop:
					return
				default:
				}
				if wait := time.Until(start.Add(time.Duration(b) * every)); wait > 0 {
					time.Sleep(wait)
				}
				nHot := int64(0)
				for i := range keys {
					if r.Float64() < pHot {
						keys[i] = "hot:x"
						nHot++
					} else {
						keys[i] = "cold:" + strconv.Itoa(r.IntN(cold))
					}
				}
				floor := newest.Load() // acknowledged before the batch is sent
				if nHot > 0 {
					firstHot.CompareAndSwap(0, time.Now().UnixNano())
				}
				hot.Add(nHot)
				all.Add(batch)
				if err := conn.gets(keys, vals); err != nil {
					t.Error(err)
					return
				}
				for i, k := range keys {
					if k != "hot:x" {
						continue
					}
					reads.Add(1)
					if got := versionIn(vals[i]); vals[i] == "" || got < floor {
						stale.Add(1)
						exMu.Lock()
						if len(examples) < 5 {
							examples = append(examples, fmt.Sprintf("read %q after %d was acknowledged", vals[i], floor))
						}
						exMu.Unlock()
					}
				}
			}
		})
	}
	var writes atomic.Int64
	wg.Go(func() { // a write every 100 ms
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for v := int64(2); v < maxOps; v++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if !write(v) {
				return
			}
			writes.Add(1)
		}
	})
	stopLoad := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopLoad()

	// Found hot within 2 s of its first request.
	for !slices.ContainsFunc(hotKeys(t, admin), func(l hotKeyLine) bool { return l.Key == "hot:x" }) {
		if time.Since(start) > 30*time.Second {
			stopLoad()
			t.Fatalf("hot:x not found hot in 30 s (%d gets sent)", all.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	found := time.Since(time.Unix(0, firstHot.Load()))
	hits0, detail0, client0, all0 := hkaServerGetHits(t, mc.Addr), detailGets(t, mc.Addr, "hot"), hot.Load(), all.Load()
	misses0 := metricValue(t, admin, "moxi_hotcache_misses_total")
	at0 := time.Now()
	time.Sleep(measure)
	hits, detail, client, n := hkaServerGetHits(t, mc.Addr)-hits0, detailGets(t, mc.Addr, "hot")-detail0, hot.Load()-client0, all.Load()-all0
	took := time.Since(at0)
	misses := metricValue(t, admin, "moxi_hotcache_misses_total") - misses0
	cacheHits := metricValue(t, admin, "moxi_hotcache_hits_total")
	stopLoad()
	if e := writeErr.Load(); e != nil {
		t.Error(e)
	}

	rate := float64(n) / took.Seconds()
	t.Logf("hot:x found hot %v after its first get", found.Round(time.Millisecond))
	t.Logf("over %v after that: %d gets (%.0f gets/s, paced at %d), %d of them of hot:x (%.0f/s, %.1f %%)",
		took.Round(time.Millisecond), n, rate, aimRate, client, float64(client)/took.Seconds(), 100*float64(client)/float64(n))
	t.Logf("its server saw %d reads of hot:x (gets and mg expiry asks: %.3f %% of them), %d of them gets (stats detail: %.3f %%); moxi's hot cache missed %.0f times (%.1f/s), hit %.0f times in all",
		hits, 100*float64(hits)/float64(client), detail, 100*float64(detail)/float64(client), misses, misses/took.Seconds(), cacheHits)
	t.Logf("%d writes of hot:x acknowledged (one per 100 ms); %d reads of hot:x in all, %d older than the newest write acknowledged before the get was sent",
		writes.Load(), reads.Load(), stale.Load())
	if rate < aimRate {
		t.Logf("NOTE: %.0f gets/s is below the aim of %d gets/s on this machine; the figures above hold at that rate", rate, aimRate)
	}
	if found > 2*time.Second {
		t.Errorf("hot:x found hot %v after its first request, want within 2 s", found)
	}
	if client < 1000 {
		t.Fatalf("only %d gets of hot:x in %v", client, took)
	}
	if float64(hits) > maxShare*float64(client) {
		t.Errorf("its server saw %d reads of hot:x (gets and expiry asks) for %d gets of it through moxi: %.3f %%, more than 1 %%", hits, client, 100*float64(hits)/float64(client))
	}
	if writes.Load() < int64(measure/(100*time.Millisecond))/2 {
		t.Errorf("only %d writes of hot:x acknowledged", writes.Load())
	}
	if stale.Load() != 0 {
		t.Errorf("%d of %d reads of hot:x older than the newest write acknowledged before them: %v", stale.Load(), reads.Load(), examples)
	}
}

// hkaServerGetHits is memcached's get_hits: gets and meta gets that found their item.
func hkaServerGetHits(t *testing.T, addr string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(memcachedtest.Stats(t, addr)["get_hits"], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestAcceptHotCachePeers60s: moxi A and B, each the other's hot_cache.peers, hot_cache of
// "hot:" keys with a 60 s ttl; for 60 s a writer sets rising versions of 20 hot keys through
// A while 4 clients read them through B: no read returns a version older than one
// acknowledged through A more than 50 ms before the read was sent. (With a 60 s ttl, B's
// entries are ended by A's invalidations alone.)
//
// The 50 ms is a bound in time, so both moxi are built without the race detector, as the
// suite's other tests that time answers are (fastMoxi); TestHotCachePeers runs the same
// path on the race build. Staleness is measured from the clients' clocks: the writer takes
// the time after A's answer, a reader before sending its get, so that every delay of the
// test's own goroutines makes the measured staleness smaller, never larger. The stale
// reads are logged by staleness.
func TestAcceptHotCachePeers60s(t *testing.T) {
	const run, allowed = 60 * time.Second, 50 * time.Millisecond
	mc := cluster(t, 1)[0]
	adminA, adminB := freeAddr(t), freeAddr(t)
	tier := startPeerTier(t, fastMoxi(t), mc.Addr, adminA, adminB, []string{adminB}, []string{adminA}, 60*time.Second)
	s := peerLoad(t, tier, run, allowed)
	sent := counterValue(t, adminA, fmt.Sprintf(`moxi_peer_invalidations_total{peer=%q,result="sent"}`, adminB))
	failed := counterValue(t, adminA, fmt.Sprintf(`moxi_peer_invalidations_total{peer=%q,result="failed"}`, adminB))
	taken := counterValue(t, adminB, `moxi_hotcache_invalidations_total{source="peer"}`)
	hits := counterValue(t, adminB, "moxi_hotcache_hits_total")
	t.Logf("%v: %d writes through A, %d reads through B (%d misses, %.0f hot cache hits); %d older than a version acknowledged more than 50 ms before the get, %d older than one acknowledged within those 50 ms; the worst staleness %v",
		run, s.writes, s.reads, s.misses, hits, s.beyond, s.within, s.worst.Round(100*time.Microsecond))
	t.Logf("A sent B %.0f invalidations (%.0f failed), B took %.0f; stale reads by staleness: %s", sent, failed, taken, s.histogram())
	if s.reads < 10_000 || s.writes < 1000 {
		t.Fatalf("only %d reads and %d writes", s.reads, s.writes)
	}
	if s.beyond != 0 {
		t.Errorf("%d reads through B older than a version acknowledged through A more than 50 ms before: %v", s.beyond, s.examples)
	}
	if hits == 0 || sent == 0 || taken == 0 {
		t.Errorf("B's hot cache hits %.0f, invalidations A sent B %.0f, B took %.0f: want all > 0", hits, sent, taken)
	}
}

// TestAcceptHotCachePeerUnreachable: A's hot_cache.peers names B at an address where nothing
// listens, and B's ttl is 2 s: reads through B may be stale, but no read returns a version
// older than one acknowledged more than ttl + 1 s (slack for a loaded machine) before it
// was sent; and A counts the invalidations it could not deliver. (The race build: the
// bound is loose, and the failing peer's path is checked for races too.)
func TestAcceptHotCachePeerUnreachable(t *testing.T) {
	t.Parallel() // paced readers, a loose bound (the ttl): beside the other waiting checks
	const run, ttl = 20 * time.Second, 2 * time.Second
	mc := cluster(t, 1)[0]
	adminA, adminB, nowhere := freeAddr(t), freeAddr(t), freeAddr(t)
	tier := startPeerTier(t, moxiBin, mc.Addr, adminA, adminB, []string{nowhere}, []string{adminA}, ttl)
	s := peerLoad(t, tier, run, ttl+time.Second)
	failed := counterValue(t, adminA, fmt.Sprintf(`moxi_peer_invalidations_total{peer=%q,result="failed"}`, nowhere))
	hits := counterValue(t, adminB, "moxi_hotcache_hits_total")
	taken := counterValue(t, adminB, `moxi_hotcache_invalidations_total{source="peer"}`)
	t.Logf("%v with B unreachable from A, B's ttl %v: %d writes through A, %d reads through B (%d misses, %.0f hot cache hits); %d stale by at most ttl + 1 s, %d by more; the worst staleness %v",
		run, ttl, s.writes, s.reads, s.misses, hits, s.within, s.beyond, s.worst.Round(time.Millisecond))
	t.Logf("A counted %.0f invalidations to %s failed; B took %.0f from peers; stale reads by staleness: %s", failed, nowhere, taken, s.histogram())
	// Floors that show the run exercised something, far below what a loaded CI machine
	// reaches (957 writes were seen there beside the other waiting checks).
	if s.reads < 300 || s.writes < 300 {
		t.Fatalf("only %d reads and %d writes", s.reads, s.writes)
	}
	if s.beyond != 0 {
		t.Errorf("%d reads through B older than a version acknowledged more than ttl + 1 s before: %v", s.beyond, s.examples)
	}
	if failed == 0 {
		t.Errorf("A counted no failed invalidation for %s", nowhere)
	}
	if hits == 0 {
		t.Error("B's hot cache served nothing: the test shows nothing of its ttl")
	}
}

// TestAcceptHotKeysMemoryBound: 10^6 distinct 200-byte keys, each set and then read once
// through one moxi (8 pipelining clients), with hot_keys {sample: 1, cache: true} (every
// request counted in the sketch) and a hot cache of every key (prefix "p:") bounded to
// max_bytes 8 MiB, so that it fills and evicts all along: moxi answers every request
// rightly, still serves from the cache at the end, and its peak RSS (VmHWM) grows by less
// than hkaRSSBound.
//
// The bound: the hot cache counts 8 MiB of keys and values, 32,768 entries of 256 bytes;
// each costs about 1.8 times that in the heap (its name, a copy of the key, 208 bytes; the
// value's copy, 64; the LRU node holding the timed entry, 144; its map slot, ~40), so
// ~15 MiB. The sketch holds at most 2.5 MB (4096 counters of 250-byte keys; here 800
// counters, ~0.2 MB). Live, ~18 MiB at most; ×2 for the garbage collector's headroom
// (GOGC 100: the heap grows to twice what survived the last collection) ≈ 36 MiB; then the
// goroutines' stacks and buffers of the 8 client connections and the server's, the expiry
// asks (at most 64 at once), and the size classes' and spans' slack: ~10 MiB. So ~46 MiB
// expected; 64 MiB leaves room for a loaded machine's late collections, and is far below
// what the same entries unbounded would take (10^6 × ~460 bytes ≈ 440 MiB).
//
// RSS is measured on moxi built without the race detector, whose shadow memory would swamp
// it (as TestAcceptHotCacheBoundedInBytes does).
func TestAcceptHotKeysMemoryBound(t *testing.T) {
	t.Parallel() // what it measures is moxi's own memory, whatever else runs
	const (
		nkeys   = 1_000_000
		clients = 8
		batch   = 32
		keyLen  = 200
		valLen  = 56
		probe   = 1000 // keys read twice by one client at the end: the second time from the cache
	)
	mc := memcachedtest.Start(t, "-m", "1024")
	admin := freeAddr(t)
	moxi := startMoxiBin(t, fastMoxi(t), "--admin", admin, "--config", writeConfig(t, fmt.Sprintf(`watch_config: false
hot_keys: {sample: 1, cache: true}
hot_cache: {prefixes: ["p:"], max_bytes: 8388608, max_items: 100000, ttl: 1m}
pools:
  main:
    timeout: 5s
    servers: [{name: only, addr: %q}]
`, mc.Addr)))
	pid := moxi.cmd.Process.Pid
	key := func(i int) string {
		k := fmt.Appendf(nil, "p:%07d:", i)
		return string(append(k, bytes.Repeat([]byte{'k'}, keyLen-len(k))...))
	}
	val := func(i int) string {
		v := fmt.Appendf(nil, "v%07d:", i)
		return string(append(v, bytes.Repeat([]byte{'v'}, valLen-len(v))...))
	}
	// A first request, so that the baseline is a moxi that has served.
	if c, err := hkaDial(moxi.addr); err != nil {
		t.Fatal(err)
	} else {
		if err := c.sets([]string{key(nkeys)}, []string{val(nkeys)}); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	before := peakRSS(t, pid)

	var stored, right, wrong atomic.Int64
	var exMu sync.Mutex
	var examples []string
	// each runs every client over its share of the keys (i ≡ w mod clients), in batches.
	each := func(f func(c *hkaConn, keys, vals []string) error) {
		client := func(w int) {
			c, err := hkaDial(moxi.addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			var keys, vals []string
			for i := w; ; i += clients {
				if i < nkeys {
					keys, vals = append(keys, key(i)), append(vals, val(i))
				}
				if len(keys) == batch || i >= nkeys && len(keys) > 0 {
					if err := f(c, keys, vals); err != nil {
						t.Error(err)
						return
					}
					keys, vals = keys[:0], vals[:0]
				}
				if i >= nkeys {
					return
				}
			}
		}
		var wg sync.WaitGroup
		for w := range clients {
			wg.Go(func() { client(w) })
		}
		wg.Wait()
	}
	check := func(c *hkaConn, keys, vals []string) error {
		answers := make([]string, len(keys))
		if err := c.gets(keys, answers); err != nil {
			return err
		}
		for i, a := range answers {
			if a == vals[i] {
				right.Add(1)
				continue
			}
			wrong.Add(1)
			exMu.Lock()
			if len(examples) < 5 {
				examples = append(examples, fmt.Sprintf("get %.12s…: %.20q", keys[i], a))
			}
			exMu.Unlock()
		}
		return nil
	}
	start := time.Now()
	each(func(c *hkaConn, keys, vals []string) error {
		if err := c.sets(keys, vals); err != nil {
			return err
		}
		stored.Add(int64(len(keys)))
		return nil
	})
	setTook := time.Since(start)
	afterSets := peakRSS(t, pid)
	start = time.Now()
	each(check)
	getTook := time.Since(start)
	// The cache still serves: one client reads probe keys, then reads them again, each
	// answered from moxi's memory the second time. (First the expiry asks of the last fills
	// end, within a second each: while 64 wait, a fill is not cached.)
	time.Sleep(1500 * time.Millisecond)
	var probeHits float64
	if c, err := hkaDial(moxi.addr); err != nil {
		t.Error(err)
	} else {
		for range 2 {
			hits := metricValue(t, admin, "moxi_hotcache_hits_total")
			for i := range probe {
				if err := check(c, []string{key(i)}, []string{val(i)}); err != nil {
					t.Error(err)
					break
				}
			}
			probeHits = metricValue(t, admin, "moxi_hotcache_hits_total") - hits
		}
		c.Close()
	}
	after := peakRSS(t, pid)
	rss := float64(procStatus(t, pid, "VmRSS")) / 1024
	hits := metricValue(t, admin, "moxi_hotcache_hits_total")
	misses := metricValue(t, admin, "moxi_hotcache_misses_total")
	select {
	case <-moxi.exited:
		t.Fatalf("moxi exited: %v\n%s", moxi.waitErr, moxi.out.String())
	default:
	}
	growth := after - before
	fams := metricFamilies(t, admin)
	mib := func(name string) float64 { return metricSample(fams, name) / (1 << 20) }
	t.Logf("%d keys of %d bytes (values of %d) set through moxi in %v (%.0f sets/s), then read in %v (%.0f gets/s), then %d of them read twice more: %d gets answered rightly, %d wrongly",
		nkeys, keyLen, valLen, setTook.Round(time.Millisecond), nkeys/setTook.Seconds(), getTook.Round(time.Millisecond), nkeys/getTook.Seconds(),
		probe, right.Load(), wrong.Load())
	t.Logf("hot cache: %.0f misses (fills), %.0f hits; %.0f of the %d second reads of the probe keys answered from it", misses, hits, probeHits, probe)
	t.Logf("moxi's peak RSS: %.1f MiB before, %.1f MiB after the sets, %.1f MiB after the gets (VmRSS now %.1f MiB): it grew by %.1f MiB (bound %d MiB)",
		before, afterSets, after, rss, growth, hkaRSSBound)
	t.Logf("moxi's Go heap now: %.1f MiB in use, %.1f MiB allocated, next collection at %.1f MiB (so ~%.1f MiB survived the last); stacks %.1f MiB; %.1f MiB from the OS in all",
		mib("go_memstats_heap_inuse_bytes"), mib("go_memstats_heap_alloc_bytes"), mib("go_memstats_next_gc_bytes"), mib("go_memstats_next_gc_bytes")/2,
		mib("go_memstats_stack_inuse_bytes"), mib("go_memstats_sys_bytes"))
	if stored.Load() != nkeys {
		t.Errorf("%d of %d sets stored", stored.Load(), nkeys)
	}
	if want := int64(nkeys + 2*probe); right.Load() != want || wrong.Load() != 0 {
		t.Errorf("%d gets answered rightly of %d, %d wrongly: %v", right.Load(), want, wrong.Load(), examples)
	}
	if probeHits < 0.95*probe {
		t.Errorf("%.0f of %d keys read a second time, just after the first, were answered from the hot cache", probeHits, probe)
	}
	if growth >= hkaRSSBound {
		t.Errorf("moxi's peak RSS grew by %.1f MiB; want < %d MiB", growth, hkaRSSBound)
	}
}

// hkaRSSBound is TestAcceptHotKeysMemoryBound's bound on moxi's peak RSS growth, in MiB.
const hkaRSSBound = 64
