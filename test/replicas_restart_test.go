package test

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// A server of a replicated pool that restarts empty changes no answer: clients run every
// conditional command through moxi (replicas: 2, three servers) and the same commands on a
// memcached that never restarts, key by key, and compare the answers while one server is
// killed and restarted empty — once after moxi marked it dead, once faster than
// failure_limit notices.

// restartKinds are the commands compared, each on keys of its own.
var restartKinds = []string{"incr", "decr", "append", "replace", "delete", "add", "touch", "binincr", "ma", "cas"}

// restartCounters are the kinds whose keys are counters: every live replica holds the count.
var restartCounters = []string{"incr", "decr", "binincr", "ma"}

// restartClient is one client's connections: text and binary, to moxi and to the reference.
type restartClient struct {
	moxi, ref       *textClient
	moxiBin, refBin *textClient
}

// whole sends cmd and returns its whole answer: one line, or a VA line and its data, or
// VALUE lines and their data up to END, data lines joined with "|" (cas uniques dropped:
// each server numbers its own).
func (tc *textClient) whole(cmd string) (string, error) {
	_ = tc.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(tc.c, cmd); err != nil {
		return "", err
	}
	var out []string
	for {
		line, err := tc.r.ReadString('\n')
		if err != nil {
			return "", err
		}
		line = strings.TrimSuffix(line, "\r\n")
		switch f := strings.Fields(line); {
		case strings.HasPrefix(line, "VA "):
			data, err := tc.r.ReadString('\n')
			if err != nil {
				return "", err
			}
			return line + "|" + strings.TrimSuffix(data, "\r\n"), nil
		case len(f) >= 4 && f[0] == "VALUE":
			data, err := tc.r.ReadString('\n')
			if err != nil {
				return "", err
			}
			out = append(out, strings.Join(f[:4], " "), strings.TrimSuffix(data, "\r\n"))
		case line == "END":
			return strings.Join(append(out, line), "|"), nil
		default:
			return line, nil
		}
	}
}

// binIncr is a binary incr by 1 that creates a missing key with 100: its status and value.
// Each carries an opaque of its own, which its answer must echo: an answer out of step
// with its request is an error.
func (tc *textClient) binIncr(key string) (string, error) {
	opaque := binOpaque.Add(1)
	req := protocol.Request{Op: protocol.OpIncr, Binary: true, Key: []byte(key), Delta: 1, Initial: 100, Create: true, Opaque: opaque}
	_ = tc.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := tc.c.Write(protocol.AppendBinaryRequest(nil, &req)); err != nil {
		return "", err
	}
	var h protocol.BinaryResponseHeader
	var resp protocol.Response
	if err := protocol.ReadBinaryResponse(tc.r, protocol.DefaultLimits(), &h, &resp); err != nil {
		return "", err
	}
	if h.Opaque != opaque {
		return "", fmt.Errorf("answer with opaque %d to the request with %d", h.Opaque, opaque)
	}
	return fmt.Sprintf("status %d %x", h.Status, resp.Value), nil
}

// binOpaque numbers binIncr's requests.
var binOpaque atomic.Uint32

// restartRun is one run: clients × keys of each kind × rounds, the victim killed when a
// third of the operations are done and restarted after hold (0: at once), through the moxi
// binary bin (moxiBin when "").
type restartRun struct {
	clients, keys, rounds int
	hold                  time.Duration
	bin                   string
}

func (run restartRun) test(t *testing.T) {
	mcs := cluster(t, 3)
	ref := memcachedtest.Start(t)
	admin := freeAddr(t)
	bin := run.bin
	if bin == "" {
		bin = moxiBin
	}
	moxi := startMoxiBin(t, bin, "--config", writeConfig(t, replicaConfig(2, addrs(mcs)...)), "--admin", admin, "--pprof")
	const victim = 1
	set := replicaSets(3, 2)
	keyOf := func(kind string, w, i int) string { return fmt.Sprintf("%s:%d:%d", kind, w, i) }
	initial := map[string]string{"incr": "0", "decr": "1000000", "append": "a", "replace": "r", "delete": "d",
		"add": "a", "touch": "t", "binincr": "0", "ma": "0", "cas": "0"}

	var ops, servingAt, killedAt atomic.Int64 // unix nanoseconds, 0 before
	var answered atomic.Int64                 // moxi's answers (without an I/O error): the watchdog's
	var inFlight, diffs atomic.Int64
	var mu sync.Mutex
	var examples []string
	tainted := map[string]bool{} // an answer that may or may not have been applied: not compared again
	differ := func(key, what, got, want string) {
		diffs.Add(1)
		mu.Lock()
		defer mu.Unlock()
		if len(examples) < 12 {
			examples = append(examples, fmt.Sprintf("%s %s: moxi %q, memcached %q (%s)", time.Now().Format("15:04:05.000"), key, got, want, what))
		}
	}
	// A request in flight on the victim when it was killed may fail (applied or not): as
	// on a server without replicas. One a client, within a second of the kill.
	excused := func(ans string, perClient *int) bool {
		at := killedAt.Load()
		if at == 0 || !isErrorLine(ans) || time.Since(time.Unix(0, at)) > time.Second || *perClient > 0 {
			return false
		}
		*perClient++
		inFlight.Add(1)
		return true
	}

	total := run.clients * len(restartKinds) * run.keys * run.rounds
	resume := make(chan struct{})
	var resumed sync.Once
	t.Cleanup(func() { resumed.Do(func() { close(resume) }) })
	var wg sync.WaitGroup
	clients := make([]*restartClient, run.clients)
	for w := range clients {
		var c restartClient
		var err error
		for _, p := range []struct {
			conn **textClient
			addr string
		}{{&c.moxi, moxi.addr}, {&c.ref, ref.Addr}, {&c.moxiBin, moxi.addr}, {&c.refBin, ref.Addr}} {
			if *p.conn, err = dialText(p.addr); err != nil {
				t.Fatal(err)
			}
			defer (*p.conn).Close()
		}
		clients[w] = &c
		for _, kind := range restartKinds {
			for i := range run.keys {
				k, v := keyOf(kind, w, i), initial[kind]
				cmd := fmt.Sprintf("set %s 0 0 %d\r\n%s\r\n", k, len(v), v)
				for _, conn := range []*textClient{c.moxi, c.ref} {
					if ans, err := conn.whole(cmd); err != nil || ans != "STORED" {
						t.Fatalf("%s: %q %v", cmd, ans, err)
					}
				}
			}
		}
	}
	for w, c := range clients {
		wg.Go(func() {
			excuses, broken := 0, false
			both := func(key, cmd string) {
				got, err1 := c.moxi.whole(cmd)
				if err1 == nil {
					answered.Add(1)
				}
				want, err2 := c.ref.whole(cmd)
				if err1 != nil || err2 != nil {
					differ(key, cmd, fmt.Sprint(got, err1), fmt.Sprint(want, err2))
					broken = true // the stream is out of step from here: this client stops
					return
				}
				if got != want {
					if excused(got, &excuses) {
						mu.Lock()
						tainted[key] = true
						mu.Unlock()
						return
					}
					differ(key, strings.TrimSpace(cmd), got, want)
				}
			}
			for round := 0; round < run.rounds && !broken; round++ {
				if round == 2*run.rounds/3 {
					<-resume // the rest once the victim serves again: each key on both replicas
				}
				for _, kind := range restartKinds {
					for i := 0; i < run.keys && !broken; i++ {
						k := keyOf(kind, w, i)
						mu.Lock()
						skip := tainted[k]
						mu.Unlock()
						ops.Add(1)
						if skip {
							continue
						}
						switch kind {
						case "incr", "decr", "touch":
							arg := " 1"
							if kind == "touch" {
								arg = " 0"
							}
							both(k, kind+" "+k+arg+"\r\n")
						case "append":
							both(k, "append "+k+" 0 0 1\r\nx\r\n")
						case "replace":
							v := fmt.Sprintf("r%d", round)
							both(k, fmt.Sprintf("replace %s 0 0 %d\r\n%s\r\n", k, len(v), v))
						case "delete":
							both(k, "delete "+k+"\r\n")
							both(k, "set "+k+" 0 0 1\r\nd\r\n")
						case "add":
							both(k, "add "+k+" 0 0 1\r\nz\r\n")
							both(k, "get "+k+"\r\n")
						case "ma":
							both(k, "ma "+k+" v\r\n")
						case "binincr":
							got, err1 := c.moxiBin.binIncr(k)
							if err1 == nil {
								answered.Add(1)
							}
							want, err2 := c.refBin.binIncr(k)
							broken = broken || err1 != nil || err2 != nil
							switch {
							case err1 == nil && err2 == nil && got == want:
							case err1 == nil && err2 == nil && strings.HasPrefix(got, "status 134 ") && excused("SERVER_ERROR", &excuses):
								mu.Lock()
								tainted[k] = true // 0x0086: failed, maybe applied
								mu.Unlock()
							default:
								differ(k, "binary incr", fmt.Sprint(got, err1), fmt.Sprint(want, err2))
							}
						case "cas":
							run.casRound(c, k, &servingAt, differ, func(ans string) bool {
								if excused(ans, &excuses) {
									mu.Lock()
									tainted[k] = true
									mu.Unlock()
									return true
								}
								return false
							})
						}
					}
				}
			}
		})
	}
	watchdog := make(chan struct{})
	defer close(watchdog)
	go stallWatch(t, &answered, admin, watchdog, func() { _ = moxi.cmd.Process.Kill() })
	waitUntil(t, time.Now(), 60*time.Second, func() bool { return ops.Load() >= int64(total/3) })
	killedAt.Store(time.Now().UnixNano())
	mcs[victim].Stop()
	killed := time.Now()
	waitUntil(t, killed, 30*time.Second, func() bool { return time.Since(killed) >= run.hold })
	mcs[victim].Restart(t)
	stats, err := dialText(moxi.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer stats.Close()
	waitUntil(t, time.Now(), 30*time.Second, func() bool {
		lines := roundTrip(t, stats.c, stats.r, "stats proxy\r\n", "END")
		name := fmt.Sprintf("STAT main:s%d:", victim)
		return slices.Contains(lines, name+"state up") && slices.Contains(lines, name+"away 0")
	})
	servingAt.Store(time.Now().UnixNano())
	resumed.Do(func() { close(resume) })
	wg.Wait()
	t.Logf("%d operations, the victim killed after %d; %d answers differ, %d excused in flight at the kill, %d keys tainted by them",
		ops.Load(), total/3, diffs.Load(), inFlight.Load(), len(tainted))
	if diffs.Load() > 0 {
		t.Errorf("%d answers differ from a memcached that never restarted; first:\n%s", diffs.Load(), strings.Join(examples, "\n"))
	}

	// Every key reads through moxi as on the reference; a counter's every live replica
	// holds its count.
	var keys []string
	for w := range run.clients {
		for _, kind := range restartKinds {
			for i := range run.keys {
				if k := keyOf(kind, w, i); !tainted[k] {
					keys = append(keys, k)
				}
			}
		}
	}
	// memcached pads a decremented value with spaces in place — unless the item is
	// referenced elsewhere at that instant (a listing, a read), when it stores the number
	// alone: the same number either way, so values compare without trailing spaces.
	trimmed := func(m map[string]string) map[string]string {
		for k, v := range m {
			m[k] = strings.TrimRight(v, " ")
		}
		return m
	}
	want := trimmed(replicaValues(t, ref.Addr, keys))
	through := trimmed(replicaValues(t, moxi.addr, keys))
	held := make([]map[string]string, len(mcs))
	for s, mc := range mcs {
		held[s] = trimmed(replicaValues(t, mc.Addr, keys))
	}
	bad := 0
	for _, k := range keys {
		if through[k] != want[k] {
			if bad++; bad <= 10 {
				t.Errorf("%s reads %q through moxi, %q on memcached", k, through[k], want[k])
			}
		}
		kind, _, _ := strings.Cut(k, ":")
		if !slices.Contains(restartCounters, kind) {
			continue
		}
		for _, s := range set(k) {
			if v, ok := held[s][k]; !ok || v != want[k] {
				if bad++; bad <= 10 {
					t.Errorf("counter %s holds %q (present %v) on its replica s%d, %q on memcached", k, v, ok, s, want[k])
				}
			}
		}
	}
	if t.Failed() {
		// The servers' counters tell what failed a request (down, io_errors, timeouts...),
		// which a binary answer's fixed text does not.
		t.Logf("stats proxy:\n%s", strings.Join(roundTrip(t, stats.c, stats.r, "stats proxy\r\n", "END"), "\n"))
		t.Logf("moxi log:\n%s", tail(moxi.out.String(), 8<<10))
	}
}

// stallWatch fails t with moxi's goroutines (from its admin's /debug/pprof) when answered
// has not moved for 8 s (its clients wait 10 s) until done closes, and then kills moxi (halt) so that the clients end
// at once: a proxy that stops answering shows where.
func stallWatch(t *testing.T, answered *atomic.Int64, admin string, done <-chan struct{}, halt func()) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last, since := answered.Load(), time.Now()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		if n := answered.Load(); n != last {
			last, since = n, time.Now()
			continue
		}
		if time.Since(since) < 8*time.Second {
			continue
		}
		dump := "(no dump)"
		client := &http.Client{Timeout: 10 * time.Second}
		if resp, err := client.Get("http://" + admin + "/debug/pprof/goroutine?debug=2"); err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			dump = string(b)
		}
		t.Errorf("no answer from moxi for 8 s, after %d: moxi's goroutines:\n%s", last, dump)
		halt()
		return
	}
}

// casRound is gets then cas on moxi and, when moxi stored it, on the reference: the values
// read must agree, and the cas must store — or answer EXISTS when its gets came before the
// restarted server served again (it numbers cas uniques anew, and until it serves, gets
// reads the other replica, which numbers its own).
func (run restartRun) casRound(c *restartClient, k string, servingAt *atomic.Int64, differ func(key, what, got, want string), excused func(string) bool) {
	readAt := time.Now().UnixNano()
	v, cas, err1 := replicaGets(c.moxi, k)
	refV, refCas, err2 := replicaGets(c.ref, k)
	if err1 != nil || err2 != nil || v != refV {
		if err1 == nil && excused(v) {
			return
		}
		differ(k, "gets", fmt.Sprint(v, err1), fmt.Sprint(refV, err2))
		return
	}
	next := v + "c"
	got, err := c.moxi.whole(fmt.Sprintf("cas %s 0 0 %d %d\r\n%s\r\n", k, len(next), cas, next))
	switch {
	case err != nil:
		differ(k, "cas", err.Error(), "STORED")
		return
	case got == "EXISTS" && (servingAt.Load() == 0 || readAt < servingAt.Load()):
		return // not stored on moxi: the reference is left as it is
	case got != "STORED":
		if !excused(got) {
			differ(k, "cas", got, "STORED")
		}
		return
	}
	if want, err := c.ref.whole(fmt.Sprintf("cas %s 0 0 %d %d\r\n%s\r\n", k, len(next), refCas, next)); err != nil || want != "STORED" {
		differ(k, "cas on memcached", "STORED", fmt.Sprint(want, err))
	}
}

// TestReplicasRestartEmpty: the victim killed, marked dead, and restarted empty.
func TestReplicasRestartEmpty(t *testing.T) {
	restartRun{clients: 4, keys: 8, rounds: 9, hold: 1500 * time.Millisecond}.test(t)
}

// TestReplicasRestartFast: the victim killed and restarted at once, before failure_limit
// marks it dead: moxi's connections to it simply reconnect to an empty server.
func TestReplicasRestartFast(t *testing.T) {
	restartRun{clients: 4, keys: 8, rounds: 9}.test(t)
}
