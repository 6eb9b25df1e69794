package test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// The tests of this file upgrade moxi in place (docs/operating.md, "Upgrade in place"):
// SIGUSR2 or POST /upgrade starts the binary at the path moxi was started from, which by then
// holds the new binary. Each test copies a moxi to a path of its own, starts it from there,
// and before each upgrade renames another binary over that path (never a write in place:
// the running binary's text is that file). The two binaries alternated are moxiBin (build
// "dev") and the same tree built with another build string (upgradeBuildB), so that the
// `version` answer tells which one serves.

// upgradeBuildB is the build string stamped into the second binary.
const upgradeBuildB = "upgrade-b"

// moxiBuild is a moxi binary and the build string it answers `version` with.
type moxiBuild struct {
	path, build string
}

var (
	upgradeBinOnce sync.Once
	upgradeBinB    string
	upgradeBinErr  error
)

// upgradeBuilds returns the two binaries the upgrade tests alternate: A is moxiBin, B the
// same tree built with -race and -X main.version=upgradeBuildB, built once per run.
func upgradeBuilds(t testing.TB) (a, b moxiBuild) {
	t.Helper()
	upgradeBinOnce.Do(func() {
		path := filepath.Join(filepath.Dir(moxiBin), "moxi-"+upgradeBuildB)
		out, err := exec.Command("go", "build", "-race", "-ldflags", "-X main.version="+upgradeBuildB, "-o", path, "../cmd/moxi").CombinedOutput()
		if err != nil {
			upgradeBinErr = fmt.Errorf("building moxi %s: %v\n%s", upgradeBuildB, err, out)
			return
		}
		upgradeBinB = path
	})
	if upgradeBinErr != nil {
		t.Fatal(upgradeBinErr)
	}
	return moxiBuild{moxiBin, "dev"}, moxiBuild{upgradeBinB, upgradeBuildB}
}

// upgradable is a moxi started from a path of the test's own, and the processes that took
// over from it. Every process of the lineage is in one process group (the first one's: a
// successor inherits its parent's), which the test's cleanup stops: SIGTERM, then SIGKILL.
// Their output goes, through one pipe, to out.
type upgradable struct {
	t           *testing.T
	path        string // the binary's path: each upgrade renames another binary over it
	addr, admin string
	out         *syncBuffer
	outDone     chan struct{} // closed once every process holding the pipe has ended
	pgid        int
	firstExited chan struct{}
	firstErr    error // what Wait returned for the first process; read once firstExited is closed
	upgraded    int   // the upgrades that succeeded

	mu  sync.Mutex
	pid int // the process serving now
}

// startUpgradable copies b to a path of the test's own and starts it from there, listening on
// a free address, with an admin address, and args.
func startUpgradable(t *testing.T, b moxiBuild, args ...string) *upgradable {
	t.Helper()
	dir := t.TempDir()
	u := &upgradable{t: t, path: filepath.Join(dir, "moxi"), out: &syncBuffer{}, outDone: make(chan struct{}), firstExited: make(chan struct{})}
	u.install(b)
	u.addr = freeAddr(t)
	for u.admin = freeAddr(t); u.admin == u.addr; u.admin = freeAddr(t) {
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(u.path, append([]string{"--listen", u.addr, "--admin", u.admin}, args...)...)
	// An *os.File, not a Writer: Wait then returns when the first process ends, not when the
	// last successor holding the pipe does.
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", u.path, err)
	}
	pw.Close()
	u.pgid, u.pid = cmd.Process.Pid, cmd.Process.Pid
	go func() { _, _ = io.Copy(u.out, pr); pr.Close(); close(u.outDone) }()
	go func() { u.firstErr = cmd.Wait(); close(u.firstExited) }()
	t.Cleanup(u.stop)
	for _, a := range []string{u.addr, u.admin} {
		if err := memcachedtest.WaitListening(a, 30*time.Second); err != nil {
			t.Fatalf("moxi on %s: %v\n%s", a, err, u.out.String())
		}
	}
	return u
}

// stop ends every process of the group, and fails the test on a data race or a panic any
// of them reported.
func (u *upgradable) stop() {
	t := u.t
	_ = syscall.Kill(-u.pgid, syscall.SIGTERM)
	if !poll(15*time.Second, func() bool { return len(groupProcesses(u.pgid)) == 0 }) {
		t.Errorf("processes %v of moxi's group did not stop within 15 s of SIGTERM: killed", groupProcesses(u.pgid))
		_ = syscall.Kill(-u.pgid, syscall.SIGKILL)
		poll(5*time.Second, func() bool { return len(groupProcesses(u.pgid)) == 0 })
	}
	select {
	case <-u.outDone:
	case <-time.After(5 * time.Second):
		t.Errorf("moxi's output still open 5 s after its processes stopped")
	}
	out := u.out.String()
	if n := strings.Count(out, "WARNING: DATA RACE"); n > 0 {
		i := strings.Index(out, "WARNING: DATA RACE")
		t.Errorf("moxi reported %d data races:\n%s", n, out[i:min(len(out), i+maxRaceExcerpt)])
	}
	for _, bad := range []string{"panic:", "fatal error:", `msg="moxi stopped"`} {
		if i := strings.Index(out, bad); i >= 0 {
			t.Errorf("moxi's output has %q:\n%s", bad, out[max(0, i-2000):min(len(out), i+4000)])
		}
	}
	if t.Failed() {
		t.Logf("moxi's output (the last 20 KB):\n%s", out[max(0, len(out)-20<<10):])
	}
}

// install renames a copy of b over the path moxi runs from.
func (u *upgradable) install(b moxiBuild) {
	u.t.Helper()
	src, err := os.ReadFile(b.path)
	if err != nil {
		u.t.Fatal(err)
	}
	u.installBytes(src)
}

// installScript renames a shell script over the path moxi runs from.
func (u *upgradable) installScript(body string) {
	u.t.Helper()
	u.installBytes([]byte("#!/bin/sh\n" + body + "\n"))
}

func (u *upgradable) installBytes(content []byte) {
	u.t.Helper()
	tmp := u.path + ".new"
	if err := os.WriteFile(tmp, content, 0o755); err != nil {
		u.t.Fatal(err)
	}
	if err := os.Rename(tmp, u.path); err != nil {
		u.t.Fatal(err)
	}
}

// current is the process serving now.
func (u *upgradable) current() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.pid
}

// groupProcesses are the processes of group pgid that have not ended (zombies excluded).
func groupProcesses(pgid int) []int {
	var out []int
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// "pid (comm) state ppid pgrp …": comm may hold spaces, so split after its ')'.
		_, rest, ok := strings.Cut(string(b), ") ")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if g, _ := strconv.Atoi(f[2]); g == pgid {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			out = append(out, pid)
		}
	}
	return out
}

// alive reports whether process pid runs (a zombie has ended).
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z") && !strings.HasPrefix(rest, "X")
}

// cmdline is the command line of process pid, nil when it has ended.
func procCmdline(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
}

var successorReady = regexp.MustCompile(`msg="upgrade: the successor is ready" pid=(\d+)`)

// successors are the pids of the successors moxi's processes reported ready, in order.
func (u *upgradable) successors() []int {
	var pids []int
	for _, m := range successorReady.FindAllStringSubmatch(u.out.String(), -1) {
		pid, _ := strconv.Atoi(m[1])
		pids = append(pids, pid)
	}
	return pids
}

var handedOver = regexp.MustCompile(`msg="upgrade: handed over; this process ends[^"]*" connections=(\d+) tls_connections_left=(\d+)`)

// handedOver is what the n'th "handed over" line says (from 0): the connections handed
// over and the TLS ones left; ok false while there is no such line yet.
func (u *upgradable) handedOver(n int) (conns, tlsLeft int, ok bool) {
	ms := handedOver.FindAllStringSubmatch(u.out.String(), -1)
	if n >= len(ms) {
		return 0, 0, false
	}
	conns, _ = strconv.Atoi(ms[n][1])
	tlsLeft, _ = strconv.Atoi(ms[n][2])
	return conns, tlsLeft, true
}

// upgradeResult is how one upgrade went.
type upgradeResult struct {
	oldPID, newPID int
	ready          time.Duration // from the trigger to the successor reported ready
	oldGone        time.Duration // from the trigger to the old process's end
	oldCounted     string        // how moxi_upgrades_total{result="ok"} = 1 on the old process was seen
	trigger        time.Time
	goneAt         time.Time
}

// upgrade installs b, triggers an upgrade (POST /upgrade, or SIGUSR2 when signal), and
// waits for it to be done: the successor ready, running from u.path, the old process gone
// within goneWithin (not waited for when 0), and `version` answered with b's build on a new
// connection. It checks
// that the old process counted the upgrade in moxi_upgrades_total{result="ok"}: scraped
// from it over an admin connection it accepted (the listening socket is the successor's
// once the upgrade is under way), or, when it ended before answering, its log line.
func (u *upgradable) upgrade(b moxiBuild, signal bool, goneWithin time.Duration) upgradeResult {
	t := u.t
	t.Helper()
	u.install(b)
	old := u.current()
	before := len(u.successors())
	// An admin connection served by the old process: the scrape after the upgrade goes to it.
	ac, err := dialAdmin(u.admin)
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	if code, _, err := ac.do("GET /healthz"); err != nil || code != http.StatusOK {
		t.Fatalf("GET /healthz before the upgrade: %d %v", code, err)
	}
	r := upgradeResult{oldPID: old, trigger: time.Now()}
	var oldMetrics string
	if signal {
		if err := syscall.Kill(old, syscall.SIGUSR2); err != nil {
			t.Fatalf("SIGUSR2 to %d: %v", old, err)
		}
		if !poll(20*time.Second, func() bool { return len(u.successors()) > before }) {
			t.Fatalf("no successor ready within 20 s of SIGUSR2 to %d", old)
		}
		r.ready = time.Since(r.trigger)
		if code, body, err := ac.do("GET /metrics"); err == nil && code == http.StatusOK {
			oldMetrics = body
		}
	} else {
		// The scrape is pipelined behind the POST: the old process reads it as soon as it
		// has answered the POST, before it may end.
		res, err := ac.pipeline("POST /upgrade", "GET /metrics")
		if len(res) == 0 {
			t.Fatalf("POST /upgrade: %v", err)
		}
		r.ready = time.Since(r.trigger)
		if res[0].code != http.StatusOK {
			t.Fatalf("POST /upgrade: %d %s", res[0].code, res[0].body)
		}
		if len(res) > 1 && res[1].code == http.StatusOK {
			oldMetrics = res[1].body
		}
		if !poll(10*time.Second, func() bool { return len(u.successors()) > before }) {
			t.Fatalf("POST /upgrade answered 200 but no successor logged ready")
		}
	}
	pids := u.successors()
	if len(pids) != before+1 {
		t.Fatalf("%d successors reported ready, want 1: %v", len(pids)-before, pids[before:])
	}
	r.newPID = pids[before]
	if args := procCmdline(r.newPID); len(args) == 0 || args[0] != u.path {
		t.Fatalf("the successor %d runs %q, want %s", r.newPID, args, u.path)
	}
	switch {
	case oldMetrics != "":
		if v, ok := seriesInText(oldMetrics, `moxi_upgrades_total{result="ok"}`); !ok || v != 1 {
			t.Errorf(`process %d: moxi_upgrades_total{result="ok"} = %v (found %v), want 1`, old, v, ok)
		}
		r.oldCounted = "scraped"
	case strings.Contains(u.out.String(), fmt.Sprintf(`msg="upgrade: the successor is ready" pid=%d`, r.newPID)):
		r.oldCounted = "logged (it ended before the scrape)"
	default:
		t.Errorf("process %d: its upgrade is neither in its moxi_upgrades_total nor in its log", old)
	}
	u.mu.Lock()
	u.pid = r.newPID
	u.mu.Unlock()
	if goneWithin == 0 {
		// The old process may still serve: a connection it accepted before it closed the
		// listening socket, answered before it is handed over, would say the old build.
		if !poll(10*time.Second, func() bool { return strings.HasSuffix(moxiVersion(t, u.addr), " moxi/"+b.build) }) {
			t.Fatalf("after the upgrade to %s, version answers %q", b.build, moxiVersion(t, u.addr))
		}
		return r
	}
	if !poll(goneWithin, func() bool { return !running(old) }) {
		t.Fatalf("the old process %d still runs %v after the upgrade", old, goneWithin)
	}
	r.goneAt = time.Now()
	r.oldGone = r.goneAt.Sub(r.trigger)
	u.upgraded++
	// It ended as a process that stopped serving does: its exit status when it is this
	// test's child (the first), else its last log line (its parent is gone).
	if old == u.pgid {
		select {
		case <-u.firstExited:
			if u.firstErr != nil {
				t.Errorf("the first process ended: %v", u.firstErr)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("the first process ended but was not reaped within 5 s")
		}
	}
	if !poll(5*time.Second, func() bool { return strings.Count(u.out.String(), "level=INFO msg=stopped\n") >= u.upgraded }) {
		t.Errorf("%d upgrades but %d old processes logged they stopped", u.upgraded, strings.Count(u.out.String(), "level=INFO msg=stopped\n"))
	}
	if !running(r.newPID) {
		t.Fatalf("the successor %d is not running", r.newPID)
	}
	if v := moxiVersion(t, u.addr); !strings.HasSuffix(v, " moxi/"+b.build) {
		t.Fatalf("after the upgrade to %s, version answers %q", b.build, v)
	}
	return r
}

// moxiVersion is moxi's `version` answer on a new connection.
func moxiVersion(t testing.TB, addr string) string {
	t.Helper()
	c, err := dialText(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	v, err := c.call("version\r\n")
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// seriesInText is the value of series in a /metrics text.
func seriesInText(metrics, series string) (float64, bool) {
	for _, line := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}

// adminConn is one HTTP/1.1 connection to the admin address: whichever process accepted it
// serves every request on it.
type adminConn struct {
	nc net.Conn
	r  *bufio.Reader
}

type adminAnswer struct {
	code int
	body string
}

func dialAdmin(addr string) (*adminConn, error) {
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	return &adminConn{nc: nc, r: bufio.NewReader(nc)}, nil
}

func (a *adminConn) Close() error { return a.nc.Close() }

// do sends one request ("METHOD /path") and reads its answer.
func (a *adminConn) do(req string) (int, string, error) {
	res, err := a.pipeline(req)
	if len(res) == 0 {
		return 0, "", err
	}
	return res[0].code, res[0].body, nil
}

// pipeline sends reqs in one write and reads their answers, as many as came before an error.
func (a *adminConn) pipeline(reqs ...string) ([]adminAnswer, error) {
	var b strings.Builder
	for _, r := range reqs {
		fmt.Fprintf(&b, "%s HTTP/1.1\r\nHost: moxi\r\nContent-Length: 0\r\n\r\n", r)
	}
	_ = a.nc.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := io.WriteString(a.nc, b.String()); err != nil {
		return nil, err
	}
	var out []adminAnswer
	for range reqs {
		resp, err := http.ReadResponse(a.r, nil)
		if err != nil {
			return out, err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return out, err
		}
		out = append(out, adminAnswer{resp.StatusCode, string(body)})
	}
	return out, nil
}

// versionedKeys are keys written with rising versions (decimal values) by their one
// writer, and read by anyone: a read older than the newest version acknowledged before the
// get was sent is stale.
type versionedKeys struct {
	keys   []string
	newest []atomic.Int64

	reads, stale, acked, misses atomic.Int64
	mu                          sync.Mutex
	examples                    []string
}

func newVersionedKeys(prefix string, n int) *versionedKeys {
	v := &versionedKeys{keys: make([]string, n), newest: make([]atomic.Int64, n)}
	for i := range v.keys {
		v.keys[i] = fmt.Sprintf("%s:%d", prefix, i)
	}
	return v
}

// check counts a read of key i that returned value (found false: a miss), floor being the
// newest version acknowledged before it was sent.
func (v *versionedKeys) check(i int, value string, found bool, floor int64) {
	v.reads.Add(1)
	if !found {
		v.misses.Add(1)
		return
	}
	if got := versionIn(value); got < floor {
		v.stale.Add(1)
		v.mu.Lock()
		if len(v.examples) < 10 {
			v.examples = append(v.examples, fmt.Sprintf("%s read %d after %d was acknowledged", v.keys[i], got, floor))
		}
		v.mu.Unlock()
	}
}

// upMode is how a raw client sends its requests.
type upMode struct {
	pipeline bool // several requests per write, their answers read together
	split    bool // each write in two packets 1 ms apart, cut in the middle of a request
	// noreply: pipelined sets with noreply, each followed by a get of its key, which must
	// read what the set wrote (a connection reads its own writes, whichever process
	// serves the get); with split, cut right after the first set.
	noreply bool
}

func (m upMode) String() string {
	s := "one at a time"
	if m.pipeline {
		s = "pipelined"
	}
	if m.noreply {
		s += ", noreply"
	}
	if m.split {
		s += ", split"
	}
	return s
}

// upClient is a persistent text connection doing versioned sets of its own keys (every
// n'th of keys, from id) and gets of any, with a `version` now and then, until stopped.
// Any error ends it: errs and closed count them.
type upClient struct {
	id    int
	n     int
	mode  upMode
	keys  *versionedKeys
	nc    net.Conn
	r     *bufio.Reader
	local string

	exchanges, requests, answered atomic.Int64
	errs, closed                  atomic.Int64
	err                           atomic.Pointer[error]

	mu       sync.Mutex
	versions []string        // the `version` answers, each once, in the order they changed
	lat      []latencySample // each exchange: when it was sent, how long until its last answer
	version  string          // the last `version` answer
}

// latencySample is one exchange's latency.
type latencySample struct {
	at time.Time
	d  time.Duration
}

func dialUpClient(t testing.TB, addr string, id, n int, mode upMode, keys *versionedKeys) *upClient {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return newUpClient(t, nc, id, n, mode, keys)
}

// newUpClient is an upClient over nc (a TLS connection, say), which it closes at the end of
// the test.
func newUpClient(t testing.TB, nc net.Conn, id, n int, mode upMode, keys *versionedKeys) *upClient {
	t.Cleanup(func() { nc.Close() })
	return &upClient{id: id, n: n, mode: mode, keys: keys, nc: nc, r: bufio.NewReaderSize(nc, 64<<10), local: nc.LocalAddr().String()}
}

// upOp is one request of an exchange.
type upOp struct {
	kind    byte // 's' set, 'g' get, 'v' version
	key     int
	ver     int64 // a set's version
	floor   int64 // a get's floor
	noreply bool  // a set with noreply: no answer; a get of its own write, which confirms it
}

// run sends exchanges until stop closes, pacing each by pause.
func (c *upClient) run(stop <-chan struct{}, pause time.Duration) {
	rng := rand.New(rand.NewPCG(uint64(c.id), 42))
	next := make(map[int]int64) // this client's next version of each of its keys
	var mine []int
	for i := c.id; i < len(c.keys.keys); i += c.n {
		mine = append(mine, i)
	}
	var buf []byte
	for it := 0; ; it++ {
		select {
		case <-stop:
			return
		default:
		}
		ops := 1
		if c.mode.pipeline {
			ops = 6 + rng.IntN(6)
		}
		batch := make([]upOp, 0, ops+1)
		buf = buf[:0]
		cut := 0
		for j := range ops {
			if c.mode.noreply {
				k := mine[rng.IntN(len(mine))]
				next[k]++
				v := next[k]
				val := strconv.FormatInt(v, 10)
				buf = fmt.Appendf(buf, "set %s 0 0 %d noreply\r\n%s\r\n", c.keys.keys[k], len(val), val)
				if j == 0 {
					cut = len(buf)
				}
				buf = fmt.Appendf(buf, "get %s\r\n", c.keys.keys[k])
				batch = append(batch, upOp{kind: 's', key: k, ver: v, noreply: true}, upOp{kind: 'g', key: k, ver: v, floor: v, noreply: true})
				continue
			}
			if (it+j)%2 == 0 {
				k := mine[rng.IntN(len(mine))]
				next[k]++
				v := next[k]
				batch = append(batch, upOp{kind: 's', key: k, ver: v})
				val := strconv.FormatInt(v, 10)
				buf = fmt.Appendf(buf, "set %s 0 0 %d\r\n%s\r\n", c.keys.keys[k], len(val), val)
			} else {
				k := rng.IntN(len(c.keys.keys))
				batch = append(batch, upOp{kind: 'g', key: k, floor: c.keys.newest[k].Load()})
				buf = fmt.Appendf(buf, "get %s\r\n", c.keys.keys[k])
			}
		}
		if c.mode.pipeline || it%8 == 0 {
			batch = append(batch, upOp{kind: 'v'})
			buf = append(buf, "version\r\n"...)
		}
		if err := c.exchange(buf, batch, cut); err != nil {
			c.fail(err)
			return
		}
		if pause > 0 {
			time.Sleep(pause)
		}
	}
}

func (c *upClient) fail(err error) {
	c.errs.Add(1)
	var ne net.Error
	if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || (errors.As(err, &ne) && !ne.Timeout()) {
		c.closed.Add(1)
	}
	err = fmt.Errorf("client %d (%s, %s): %w", c.id, c.mode, c.local, err)
	c.err.Store(&err)
}

// exchange writes buf (split in two packets when the mode says so, at cut, else in the
// middle) and reads batch's answers.
func (c *upClient) exchange(buf []byte, batch []upOp, cut int) error {
	start := time.Now()
	_ = c.nc.SetDeadline(start.Add(20 * time.Second))
	for _, op := range batch {
		if op.kind != 's' || !op.noreply {
			c.requests.Add(1)
		}
	}
	if c.mode.split && len(buf) > 1 {
		if cut <= 0 || cut >= len(buf) {
			cut = len(buf) / 2
		}
		if _, err := c.nc.Write(buf[:cut]); err != nil {
			return err
		}
		time.Sleep(time.Millisecond)
		buf = buf[cut:]
	}
	if _, err := c.nc.Write(buf); err != nil {
		return err
	}
	for _, op := range batch {
		if op.kind == 's' && op.noreply {
			continue
		}
		line, err := c.r.ReadString('\n')
		if err != nil {
			return err
		}
		line = strings.TrimSuffix(line, "\r\n")
		switch op.kind {
		case 's':
			if line != "STORED" {
				return fmt.Errorf("set %s: %q", c.keys.keys[op.key], line)
			}
			c.keys.newest[op.key].Store(op.ver) // only this client writes the key
			c.keys.acked.Add(1)
		case 'g':
			if line == "END" {
				if op.noreply { // the set just before it on this connection was overtaken, or lost
					c.keys.check(op.key, "0", true, op.floor)
					break
				}
				c.keys.check(op.key, "", false, op.floor)
				break
			}
			var key string
			var flags, n int
			if _, err := fmt.Sscanf(line, "VALUE %s %d %d", &key, &flags, &n); err != nil || key != c.keys.keys[op.key] {
				return fmt.Errorf("get %s: %q", c.keys.keys[op.key], line)
			}
			data := make([]byte, n+2)
			if _, err := io.ReadFull(c.r, data); err != nil {
				return err
			}
			if end, err := c.r.ReadString('\n'); err != nil || end != "END\r\n" {
				return fmt.Errorf("get %s: %q after the value (%v)", c.keys.keys[op.key], end, err)
			}
			c.keys.check(op.key, string(data[:n]), true, op.floor)
			if op.noreply && versionIn(string(data[:n])) >= op.ver {
				c.keys.newest[op.key].Store(op.ver) // the set is applied: acknowledged by the read
				c.keys.acked.Add(1)
			}
		case 'v':
			v, ok := strings.CutPrefix(line, "VERSION ")
			if !ok {
				return fmt.Errorf("version: %q", line)
			}
			c.mu.Lock()
			if v != c.version {
				c.version = v
				c.versions = append(c.versions, v)
			}
			c.mu.Unlock()
		}
		c.answered.Add(1)
	}
	c.mu.Lock()
	c.lat = append(c.lat, latencySample{start, time.Since(start)})
	c.mu.Unlock()
	c.exchanges.Add(1)
	return nil
}

// lastVersion is the last `version` answer the client read.
func (c *upClient) lastVersion() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.version
}

func (c *upClient) versionsSeen() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.versions)
}

// failure is the error that ended the client, or nil.
func (c *upClient) failure() error {
	if p := c.err.Load(); p != nil {
		return *p
	}
	return nil
}

// upClients starts n raw clients, cycling through modes, on keys.
func upClients(t *testing.T, addr string, n int, keys *versionedKeys, modes []upMode, stop *loadStop, pause time.Duration) []*upClient {
	t.Helper()
	cs := make([]*upClient, n)
	for i := range cs {
		cs[i] = dialUpClient(t, addr, i, n, modes[i%len(modes)], keys)
	}
	for _, c := range cs {
		stop.wg.Add(1)
		go func() { defer stop.wg.Done(); c.run(stop.ch, pause) }()
	}
	return cs
}

// loadStop stops the load goroutines started with it.
type loadStop struct {
	ch   chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

// loadStopper returns a loadStop and the function that closes it and waits for the goroutines
// (safe to call more than once, so also deferred).
func loadStopper() (*loadStop, func()) {
	s := &loadStop{ch: make(chan struct{})}
	return s, func() {
		s.once.Do(func() { close(s.ch) })
		s.wg.Wait()
	}
}

// upModes are the raw clients' ways of sending, in turn.
var upModes = []upMode{
	{}, {pipeline: true, split: true}, {split: true}, {pipeline: true, noreply: true},
	{pipeline: true}, {pipeline: true, noreply: true, split: true},
}

// waitClients waits until every client has completed more exchanges than it had in from, and
// its last `version` answer ends with " moxi/"+build (build "" is any).
func waitClients(t *testing.T, cs []*upClient, from []int64, build string, limit time.Duration) {
	t.Helper()
	ok := poll(limit, func() bool {
		for i, c := range cs {
			if c.failure() != nil {
				return true // reported at the end
			}
			if c.exchanges.Load() <= from[i] || (build != "" && !strings.HasSuffix(c.lastVersion(), " moxi/"+build)) {
				return false
			}
		}
		return true
	})
	if !ok {
		for _, c := range cs {
			t.Logf("client %d (%s): %d exchanges, last version %q", c.id, c.mode, c.exchanges.Load(), c.lastVersion())
		}
		t.Fatalf("the clients made no progress (or did not see version %q) within %v", build, limit)
	}
}

func exchangesOf(cs []*upClient) []int64 {
	out := make([]int64, len(cs))
	for i, c := range cs {
		out[i] = c.exchanges.Load()
	}
	return out
}

// checkUpClients fails the test on any client error, closed connection, unanswered request
// or stale read, and on a client whose `version` answers did not follow want (each build's
// answer once, in order); it logs the figures.
func checkUpClients(t *testing.T, cs []*upClient, keys *versionedKeys, want []string) {
	t.Helper()
	var exchanges, requests, answered, errs, closed int64
	for _, c := range cs {
		exchanges += c.exchanges.Load()
		requests += c.requests.Load()
		answered += c.answered.Load()
		errs += c.errs.Load()
		closed += c.closed.Load()
		if err := c.failure(); err != nil {
			t.Errorf("%v", err)
		}
		if c.nc.LocalAddr().String() != c.local {
			t.Errorf("client %d: its socket changed", c.id)
		}
		seen := c.versionsSeen()
		match := len(seen) == len(want)
		for i := 0; match && i < len(seen); i++ {
			match = strings.HasSuffix(seen[i], " moxi/"+want[i])
		}
		if !match {
			t.Errorf("client %d (%s): version answers %q, want builds %q in that order", c.id, c.mode, seen, want)
		}
		t.Logf("client %d (%s, %s): %d exchanges, %d requests, %d answered, versions %q", c.id, c.mode, c.local, c.exchanges.Load(), c.requests.Load(), c.answered.Load(), seen)
	}
	t.Logf("raw clients: %d exchanges, %d requests, %d answered, %d errors, %d closed connections; %d reads (%d misses), %d stale, %d acknowledged writes",
		exchanges, requests, answered, errs, closed, keys.reads.Load(), keys.misses.Load(), keys.stale.Load(), keys.acked.Load())
	if errs > 0 || closed > 0 {
		t.Errorf("%d client errors, %d closed connections; want 0", errs, closed)
	}
	if answered != requests {
		t.Errorf("%d requests sent, %d answered", requests, answered)
	}
	if s := keys.stale.Load(); s > 0 {
		t.Errorf("%d stale reads; want 0:\n%s", s, strings.Join(keys.examples, "\n"))
	}
	if keys.reads.Load() < 100 || keys.acked.Load() < 100 {
		t.Errorf("only %d reads and %d acknowledged writes: the check saw too little", keys.reads.Load(), keys.acked.Load())
	}
}

// TestUpgradeKeepsClients: 8 persistent raw text clients — one request at a time or
// pipelined, some with each write split in two packets 1 ms apart — set and get versioned
// values while moxi is upgraded 3 times, alternating two builds (POST /upgrade, SIGUSR2,
// POST /upgrade). Every request is answered, with no error, no closed connection and no
// stale read; each client's `version` answers go A, B, A, B; each old process counted its
// upgrade (moxi_upgrades_total{result="ok"}) and is gone; a new connection's `version`
// answers the new build.
func TestUpgradeKeepsClients(t *testing.T) {
	a, b := upgradeBuilds(t)
	mcs := cluster(t, 2)
	u := startUpgradable(t, a, "--config", writeConfig(t, "watch_config: false\n"+poolConfig("", addrs(mcs)...)))
	keys := newVersionedKeys("upgrade", 64)
	stop, halt := loadStopper()
	defer halt()
	cs := upClients(t, u.addr, 8, keys, upModes, stop, 0)
	waitClients(t, cs, make([]int64, len(cs)), a.build, 20*time.Second)

	builds := []moxiBuild{b, a, b}
	for i, nb := range builds {
		signal := i == 1
		r := u.upgrade(nb, signal, 20*time.Second)
		conns, _, _ := u.handedOver(i)
		how := "POST /upgrade"
		if signal {
			how = "SIGUSR2"
		}
		t.Logf("upgrade %d (%s) to %s: pid %d -> %d, ready after %v, old gone after %v, %d connections handed over, old's ok count %s",
			i+1, how, nb.build, r.oldPID, r.newPID, r.ready.Round(time.Millisecond), r.oldGone.Round(time.Millisecond), conns, r.oldCounted)
		if conns < len(cs) {
			t.Errorf("upgrade %d: %d connections handed over, want at least the %d clients'", i+1, conns, len(cs))
		}
		waitClients(t, cs, exchangesOf(cs), nb.build, 20*time.Second)
	}
	halt()
	checkUpClients(t, cs, keys, []string{a.build, b.build, a.build, b.build})
	if v := counterValue(t, u.admin, `moxi_upgrades_total{result="ok"}`); v != 0 {
		t.Errorf(`the last successor's moxi_upgrades_total{result="ok"} = %v, want 0 (it upgraded nothing)`, v)
	}
}

// TestUpgradeFailedSuccessor: the file at moxi's path is replaced by a script that exits 1
// at once, by one that runs moxi with a flag it does not know (a new version refusing the
// old's command line), and by a file that is no executable at all: POST /upgrade answers
// 500 each time, at once, the old process keeps serving (same pid, same version, its
// clients see no error) and counts moxi_upgrades_total{result="failed"}; then a real binary
// at the path upgrades fine. (A successor that is never ready, which takes the full 10 s, is
// TestAcceptUpgradeNeverReady's.)
func TestUpgradeFailedSuccessor(t *testing.T) {
	t.Parallel() // mostly waits
	a, b := upgradeBuilds(t)
	mcs := cluster(t, 1)
	u := startUpgradable(t, a, "--config", writeConfig(t, "watch_config: false\n"+poolConfig("", addrs(mcs)...)))
	keys := newVersionedKeys("failed", 32)
	stop, halt := loadStopper()
	defer halt()
	cs := upClients(t, u.addr, 4, keys, upModes, stop, time.Millisecond)
	waitClients(t, cs, make([]int64, len(cs)), a.build, 20*time.Second)
	first := u.current()

	cases := []struct {
		name    string
		install func()
	}{
		{"a script that exits 1", func() { u.installScript("exit 1") }},
		{"moxi refusing its arguments", func() { u.installScript("exec " + a.path + " --no-such-flag \"$@\"") }},
		{"not an executable", func() { u.installBytes([]byte("\x00\x01 not a program\n")) }},
	}
	for i, tc := range cases {
		tc.install()
		start := time.Now()
		code, body := adminDo(t, "POST", "http://"+u.admin+"/upgrade", "")
		took := time.Since(start)
		t.Logf("%s: POST /upgrade answered %d after %v: %s", tc.name, code, took.Round(time.Millisecond), strings.TrimSpace(body))
		if code != http.StatusInternalServerError || !strings.Contains(body, "keeps serving") {
			t.Errorf("%s: POST /upgrade answered %d %q, want 500 and that the process keeps serving", tc.name, code, body)
		}
		if took > 5*time.Second {
			t.Errorf("%s: the failure took %v to tell; the successor ended at once", tc.name, took)
		}
		if !running(first) {
			t.Fatalf("%s: the old process %d is gone", tc.name, first)
		}
		if got := groupProcesses(u.pgid); !slices.Equal(got, []int{first}) {
			t.Errorf("%s: processes %v run, want only the old one (%d)", tc.name, got, first)
		}
		if v := counterValue(t, u.admin, `moxi_upgrades_total{result="failed"}`); v != float64(i+1) {
			t.Errorf(`%s: moxi_upgrades_total{result="failed"} = %v, want %d`, tc.name, v, i+1)
		}
		if v := moxiVersion(t, u.addr); !strings.HasSuffix(v, " moxi/"+a.build) {
			t.Errorf("%s: version answers %q after the failed upgrade", tc.name, v)
		}
		waitClients(t, cs, exchangesOf(cs), a.build, 20*time.Second)
	}
	if v := counterValue(t, u.admin, `moxi_upgrades_total{result="ok"}`); v != 0 {
		t.Errorf(`moxi_upgrades_total{result="ok"} = %v after failed upgrades only`, v)
	}

	r := u.upgrade(b, false, 20*time.Second)
	t.Logf("then a real binary: pid %d -> %d, ready after %v, old gone after %v, old's ok count %s",
		r.oldPID, r.newPID, r.ready.Round(time.Millisecond), r.oldGone.Round(time.Millisecond), r.oldCounted)
	waitClients(t, cs, exchangesOf(cs), b.build, 20*time.Second)
	halt()
	checkUpClients(t, cs, keys, []string{a.build, b.build})
}

// TestUpgradeConcurrent: two POST /upgrade at once, on connections the serving process
// accepted: one upgrades (200), the other answers 409 at once, and only one successor is
// started. A SIGUSR2 while the upgrade runs starts none either.
func TestUpgradeConcurrent(t *testing.T) {
	t.Parallel() // mostly waits
	a, b := upgradeBuilds(t)
	u := startUpgradable(t, a, "--config", writeConfig(t, "watch_config: false\npools: {main: {embedded: 1}}\n"))
	u.install(b)
	old := u.current()
	var acs [2]*adminConn
	for i := range acs {
		ac, err := dialAdmin(u.admin)
		if err != nil {
			t.Fatal(err)
		}
		defer ac.Close()
		if code, _, err := ac.do("GET /healthz"); err != nil || code != http.StatusOK { // served by the old process
			t.Fatalf("GET /healthz: %d %v", code, err)
		}
		acs[i] = ac
	}
	type answer struct {
		code int
		body string
		took time.Duration
		err  error
	}
	answers := make(chan answer, 2)
	start := time.Now()
	for _, ac := range acs {
		go func() {
			code, body, err := ac.do("POST /upgrade")
			answers <- answer{code, body, time.Since(start), err}
		}()
	}
	var codes []int
	for range 2 {
		a := <-answers
		if a.err != nil {
			t.Fatal(a.err)
		}
		t.Logf("POST /upgrade: %d after %v: %s", a.code, a.took.Round(time.Millisecond), strings.TrimSpace(a.body))
		codes = append(codes, a.code)
		if a.code == http.StatusConflict {
			if err := syscall.Kill(old, syscall.SIGUSR2); err != nil && running(old) { // while the other runs
				t.Errorf("SIGUSR2: %v", err)
			}
		}
	}
	slices.Sort(codes)
	if !slices.Equal(codes, []int{http.StatusOK, http.StatusConflict}) {
		t.Errorf("two POST /upgrade at once answered %v, want 200 and 409", codes)
	}
	if !poll(20*time.Second, func() bool { return !running(old) }) {
		t.Fatalf("the old process %d still runs", old)
	}
	time.Sleep(500 * time.Millisecond) // a second successor, if one was started, would be up by now
	out := u.out.String()
	if n := strings.Count(out, `msg="upgrade: starting the successor"`); n != 1 {
		t.Errorf("%d successors started, want 1", n)
	}
	if got := groupProcesses(u.pgid); len(got) != 1 || !slices.Equal(got, u.successors()) {
		t.Errorf("processes %v run; want the one successor %v", got, u.successors())
	}
	if v := moxiVersion(t, u.addr); !strings.HasSuffix(v, " moxi/"+b.build) {
		t.Errorf("version answers %q, want build %s", v, b.build)
	}
}

// TestUpgradeHalfSentRequest: a client has sent half a request when moxi is upgraded, and
// sends the rest only after shutdown_timeout (2s here) has passed: the old process cannot
// hand it over at a request boundary in time, and must not close it either ("a client sees
// no close and no error"; what it sent that moxi has not decoded yet is part of what a
// connection's handover carries). Its request is answered, and its next one too, by the
// new build once the old process is gone; the other clients see no error.
func TestUpgradeHalfSentRequest(t *testing.T) {
	t.Parallel() // mostly waits
	a, b := upgradeBuilds(t)
	mcs := cluster(t, 1)
	u := startUpgradable(t, a, "--config", writeConfig(t, "watch_config: false\nshutdown_timeout: 2s\n"+poolConfig("", addrs(mcs)...)))
	keys := newVersionedKeys("half", 32)
	stop, halt := loadStopper()
	defer halt()
	cs := upClients(t, u.addr, 4, keys, upModes, stop, time.Millisecond)
	waitClients(t, cs, make([]int64, len(cs)), a.build, 20*time.Second)
	slow, err := dialText(u.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	if _, err := io.WriteString(slow.c, "set upgrade:half 0 0 5\r\nab"); err != nil {
		t.Fatal(err)
	}
	r := u.upgrade(b, false, 0)
	waitClients(t, cs, exchangesOf(cs), b.build, 20*time.Second)
	time.Sleep(3500 * time.Millisecond) // past shutdown_timeout
	oldThen := running(r.oldPID)
	conns, _, handed := u.handedOver(0)
	t.Logf("3.5 s after the upgrade (shutdown_timeout 2s): the old process %d running: %v; handed over: %v (%d connections)", r.oldPID, oldThen, handed, conns)
	ans, err := slow.call("cde\r\n")
	t.Logf("the rest of the half-sent set, 3.5 s after the upgrade: %q %v", ans, err)
	if err != nil || ans != "STORED" {
		t.Errorf("the half-sent set, completed after shutdown_timeout: %q %v; want STORED on the same connection", ans, err)
	} else {
		if !poll(10*time.Second, func() bool { return !running(r.oldPID) }) {
			t.Errorf("the old process %d still runs 10 s after its last client's request completed", r.oldPID)
		}
		if v, err := slow.call("version\r\n"); err != nil || !strings.HasSuffix(v, " moxi/"+b.build) {
			t.Errorf("its next request: version %q %v, want build %s", v, err, b.build)
		}
	}
	halt()
	checkUpClients(t, cs, keys, []string{a.build, b.build})
}
