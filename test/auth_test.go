package test

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// authConfig is a config with auth over the users file users, one pool "main" over
// servers, and extra (more pools, routes) appended.
func authConfig(users string, namespaces bool, extra string, servers ...string) string {
	return poolConfig("", servers...) + extra + fmt.Sprintf("auth:\n  users_file: %q\n  namespaces: %v\n", users, namespaces)
}

// writeUsers writes a users file ("user:password" lines) and returns its path. Every user
// may read it: memcached -Y reads it after it has become nobody.
func writeUsers(t testing.TB, lines ...string) string {
	t.Helper()
	path := filepath.Join(memcachedtest.ReadableDir(t), "users")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// readPacket reads one binary answer: its opcode, status, key and value (after extras).
func readPacket(t testing.TB, r *bufio.Reader) (opcode byte, status uint16, key, value string) {
	t.Helper()
	hdr := make([]byte, 24)
	if _, err := io.ReadFull(r, hdr); err != nil {
		t.Fatalf("binary answer: %v", err)
	}
	body := make([]byte, binary.BigEndian.Uint32(hdr[8:12]))
	if _, err := io.ReadFull(r, body); err != nil {
		t.Fatalf("binary answer's body: %v", err)
	}
	keyLen, extLen := int(binary.BigEndian.Uint16(hdr[2:4])), int(hdr[4])
	return hdr[1], binary.BigEndian.Uint16(hdr[6:8]), string(body[extLen : extLen+keyLen]), string(body[extLen+keyLen:])
}

// sendLines sends each request alone and reads its whole answer (the lines up to a final
// one), as a client waiting for each answer does.
func sendLines(t *testing.T, addr string, reqs []string) string {
	t.Helper()
	c, r := dialConn(t, addr)
	var out strings.Builder
	for _, req := range reqs {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write([]byte(req)); err != nil {
			t.Fatal(err)
		}
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("after %q: %v (so far %q)", req, err, out.String())
			}
			out.WriteString(line)
			if !strings.HasPrefix(line, "VALUE ") && !strings.HasPrefix(line, "STAT ") {
				break // the answer's last line
			}
			if strings.HasPrefix(line, "VALUE ") { // its data line
				data, err := r.ReadString('\n')
				if err != nil {
					t.Fatal(err)
				}
				out.WriteString(data)
			}
		}
	}
	return out.String()
}

// TestAuthTextLikeMemcachedY sends the same requests, one at a time, to memcached -Y and to
// moxi with auth: before the login, a bad login, a failed one, the login, and commands
// after it. The answers are the same bytes.
func TestAuthTextLikeMemcachedY(t *testing.T) {
	users := writeUsers(t, "alice:secret", "bob:pa:ss")
	mcY := memcachedtest.Start(t, "-Y", users)
	mc := memcachedtest.Start(t)
	moxi := startMoxi(t, "--config", writeConfig(t, authConfig(users, false, "", mc.Addr)))
	reqs := []string{
		"get foo\r\n", "version\r\n", "bogus\r\n", "stats\r\n", "flush_all\r\n", "delete foo\r\n",
		"set k 0 0 1 noreply\r\nx\r\n",       // refused, and answered although noreply, as memcached does
		"set auth 0 0 5\r\nalice\r\n",        // no password: a malformed login
		"set auth 0 0 11\r\nalice wrong\r\n", // a wrong one
		"set auth 0 0 9\r\nbob pa:ss\r\n",    // a password with a colon
		"set k 0 0 5\r\nhello\r\n", "get k\r\n", "append k 0 0 1\r\n!\r\n", "prepend k 0 0 1\r\n>\r\n", "get k\r\n",
		"add k 0 0 1\r\nx\r\n", "add n 0 0 2\r\n10\r\n", "incr n 5\r\n", "decr n 20\r\n", "replace n 0 0 1\r\n7\r\n",
		"touch n 100\r\n", "get k n missing\r\n", "delete k\r\n", "delete k\r\n", "get k\r\n",
		"set auth 0 0 12\r\nalice secret\r\n", // logged in already: an ordinary set
		"get auth\r\n",
	}
	want := sendLines(t, mcY.Addr, reqs)
	got := sendLines(t, moxi.addr, reqs)
	if got != want {
		t.Errorf("through moxi:\n%s\nmemcached -Y:\n%s", got, want)
	}
	if !strings.Contains(want, "CLIENT_ERROR unauthenticated") || !strings.Contains(want, "STORED") {
		t.Fatalf("memcached -Y answered unexpectedly:\n%s", want)
	}
}

// keyCommands are the server's counters of commands that read or write a key.
var keyCommands = []string{"cmd_get", "cmd_set", "cmd_touch", "cmd_flush", "delete_hits", "delete_misses", "incr_misses", "decr_misses", "total_items"}

// nothingReached fails the test unless the server at addr has seen no command that reads
// or writes a key since its stats were before.
func nothingReached(t *testing.T, addr string, before map[string]string) {
	t.Helper()
	st := memcachedtest.Stats(t, addr)
	for _, name := range keyCommands {
		if st[name] != before[name] {
			t.Errorf("server %s: %s went from %s to %s: a request reached it before its client authenticated", addr, name, before[name], st[name])
		}
	}
}

// TestAuthRefusesUnauthenticated: before authenticating, a raw binary client, pymemcache and
// libmemcached's tools (text and binary) get the refusal, and nothing reaches the server;
// with credentials, libmemcached's tools, spymemcached and pymemcache (by the text login)
// work through moxi.
func TestAuthRefusesUnauthenticated(t *testing.T) {
	users := writeUsers(t, "alice:secret")
	mc := memcachedtest.Start(t)
	moxi := startMoxi(t, "--config", writeConfig(t, authConfig(users, false, "", mc.Addr)))

	t.Run("raw binary", func(t *testing.T) {
		c, r := dialConn(t, moxi.addr)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		stores := make([]byte, 8)
		var reqs []byte
		reqs = append(reqs, binPacket(0x01, 0, stores, "bk", []byte("v"))...)                 // set
		reqs = append(reqs, binPacket(0x00, 0, nil, "bk", nil)...)                            // get
		reqs = append(reqs, binPacket(0x11, 0, stores, "bk", []byte("v"))...)                 // setq: quiet, but refused aloud
		reqs = append(reqs, binPacket(0x0a, 0, nil, "", nil)...)                              // noop
		reqs = append(reqs, binPacket(0x21, 0, nil, "PLAIN", []byte("\x00alice\x00nope"))...) // a wrong password
		reqs = append(reqs, binPacket(0x21, 0, nil, "CRAM-MD5", []byte("alice"))...)          // a mechanism moxi lacks
		reqs = append(reqs, binPacket(0x20, 0, nil, "", nil)...)                              // list mechs
		if _, err := c.Write(reqs); err != nil {
			t.Fatal(err)
		}
		want := []struct {
			op     byte
			status uint16
			value  string
		}{{0x01, 0x20, "Auth failure."}, {0x00, 0x20, "Auth failure."}, {0x11, 0x20, "Auth failure."}, {0x0a, 0x20, "Auth failure."},
			{0x21, 0x20, "Auth failure."}, {0x21, 0x20, "Auth failure."}, {0x20, 0, "PLAIN"}}
		for _, w := range want {
			op, status, _, value := readPacket(t, r)
			if op != w.op || status != w.status || value != w.value {
				t.Errorf("answer: opcode %#x status %#x %q, want %#x %#x %q", op, status, value, w.op, w.status, w.value)
			}
		}
		if _, err := c.Write(append(binPacket(0x21, 0, nil, "PLAIN", []byte("\x00alice\x00secret")), binPacket(0x01, 0, stores, "bk", []byte("v"))...)); err != nil {
			t.Fatal(err)
		}
		for _, w := range []struct {
			op     byte
			status uint16
			value  string
		}{{0x21, 0, "Authenticated"}, {0x01, 0, ""}} {
			if op, status, _, value := readPacket(t, r); op != w.op || status != w.status || value != w.value {
				t.Errorf("after the login: opcode %#x status %#x %q, want %#x %#x %q", op, status, value, w.op, w.status, w.value)
			}
		}
		// The store reached the server: what came before did not.
		st := memcachedtest.Stats(t, mc.Addr)
		if st["cmd_set"] != "1" || st["cmd_get"] != "0" {
			t.Errorf("server: cmd_set %s cmd_get %s, want 1 and 0", st["cmd_set"], st["cmd_get"])
		}
	})

	t.Run("clients without credentials", func(t *testing.T) {
		before := memcachedtest.Stats(t, mc.Addr)
		host, port, _ := net.SplitHostPort(moxi.addr)
		script := `import sys
from pymemcache.client.base import Client
c = Client((sys.argv[1], int(sys.argv[2])), timeout=10)
for name, call in [("set", lambda: c.set("pk", "v", noreply=False)), ("get", lambda: c.get("pk")), ("delete", lambda: c.delete("pk", noreply=False))]:
    try:
        print(name, "answered", call())
    except Exception as e:
        print(name, type(e).__name__, e)
`
		out, err := exec.Command("/usr/bin/python3", "-c", script, host, port).CombinedOutput()
		if err != nil {
			t.Fatalf("pymemcache: %v\n%s", err, out)
		}
		// pymemcache's set is a login attempt (memcached -Y's form), without a password.
		for _, want := range []string{"set MemcacheClientError b'bad authentication token format'", "get MemcacheClientError b'unauthenticated'", "delete MemcacheClientError b'unauthenticated'"} {
			if !strings.Contains(string(out), want) {
				t.Errorf("pymemcache: no %q in:\n%s", want, out)
			}
		}
		file := filepath.Join(t.TempDir(), "tool-key")
		if err := os.WriteFile(file, []byte("value"), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{"--servers=" + moxi.addr, file}, {"--servers=" + moxi.addr, "--binary", file}} {
			if out, err := exec.Command(requireBinary(t, "memccp"), args...).CombinedOutput(); err == nil {
				t.Errorf("memccp %v without credentials succeeded:\n%s", args, out)
			}
		}
		nothingReached(t, mc.Addr, before)
		if strings.Contains(moxi.out.String(), "nope") {
			t.Error("moxi logged a password")
		}
	})

	t.Run("clients with credentials", func(t *testing.T) {
		if err := runMemcTools(t, moxi.addr, "alice", "secret"); err != nil {
			t.Errorf("libmemcached tools: %v", err)
		}
		if out, err := runSpymemcached(t, moxi.addr, "alice", "secret"); err != nil {
			t.Errorf("spymemcached: %v\n%s", err, out)
		}
		host, port, _ := net.SplitHostPort(moxi.addr)
		script := `import sys
from pymemcache.client.base import Client
c = Client((sys.argv[1], int(sys.argv[2])), timeout=10)
c.set("login", "alice secret", noreply=False)
c.set("pk", "v1", noreply=False)
assert c.get("pk") == b"v1", c.get("pk")
assert c.add("pk", "x", noreply=False) is False
assert c.append("pk", "2", noreply=False) is True
v, cas = c.gets("pk")
assert v == b"v12", v
assert c.cas("pk", "v3", cas, noreply=False) is True
assert c.cas("pk", "v4", cas, noreply=False) is False
c.set("n", "5", noreply=False)
assert c.incr("n", 10, noreply=False) == 15
assert c.get_many(["pk", "n", "none"]) == {"pk": b"v3", "n": b"15"}, c.get_many(["pk", "n", "none"])
assert c.delete("pk", noreply=False) is True
print("ok")
`
		if out, err := exec.Command("/usr/bin/python3", "-c", script, host, port).CombinedOutput(); err != nil || !strings.Contains(string(out), "ok") {
			t.Errorf("pymemcache with the text login: %v\n%s", err, out)
		}
	})
}

// textLogin logs the text connection in as user.
func textLogin(t *testing.T, c net.Conn, r *bufio.Reader, user, password string) {
	t.Helper()
	data := user + " " + password
	if got := roundTrip(t, c, r, fmt.Sprintf("set auth 0 0 %d\r\n%s\r\n", len(data), data), "STORED"); got[len(got)-1] != "STORED" {
		t.Fatalf("login as %s: %q", user, got)
	}
}

// TestAuthNamespaces: two users set the same keys; each reads their own, the servers hold
// "alice:k" and "bob:k", and every answer names the client's keys: multi-gets, binary getk
// and getkq runs, meta k flags (base64 too). Routes match the client's key; commands that
// reach every tenant are refused; a key too long with its namespace is a CLIENT_ERROR.
func TestAuthNamespaces(t *testing.T) {
	users := writeUsers(t, "alice:secret", "bob:builder")
	mc, other := memcachedtest.Start(t), memcachedtest.Start(t)
	extra := fmt.Sprintf("  other:\n    servers: [%q]\nroutes:\n  - prefix: \"r:\"\n    pool: other\ndefault_pool: main\n", other.Addr)
	moxi := startMoxi(t, "--config", writeConfig(t, authConfig(users, true, extra, mc.Addr)))

	alice, aliceR := dialConn(t, moxi.addr)
	bob, bobR := dialConn(t, moxi.addr)
	textLogin(t, alice, aliceR, "alice", "secret")
	textLogin(t, bob, bobR, "bob", "builder")
	var multi strings.Builder
	multi.WriteString("get")
	for i := range 100 {
		roundTrip(t, alice, aliceR, fmt.Sprintf("set k%d 0 0 1\r\nA\r\n", i), "STORED")
		roundTrip(t, bob, bobR, fmt.Sprintf("set k%d 0 0 1\r\nB\r\n", i), "STORED")
		fmt.Fprintf(&multi, " k%d", i)
	}
	multi.WriteString("\r\n")
	for who, conn := range map[string]struct {
		c net.Conn
		r *bufio.Reader
	}{"A": {alice, aliceR}, "B": {bob, bobR}} {
		lines := roundTrip(t, conn.c, conn.r, multi.String(), "END")
		if len(lines) != 201 {
			t.Fatalf("multi-get of 100 keys: %d lines, want 201", len(lines))
		}
		for i := range 100 {
			if lines[2*i] != fmt.Sprintf("VALUE k%d 0 1", i) || lines[2*i+1] != who {
				t.Fatalf("multi-get answer %d: %q %q, want VALUE k%d 0 1 / %s", i, lines[2*i], lines[2*i+1], i, who)
			}
		}
	}
	direct, directR := dialConn(t, mc.Addr)
	if got := roundTrip(t, direct, directR, "get alice:k7 bob:k7 k7\r\n", "END"); strings.Join(got, "|") != "VALUE alice:k7 0 1|A|VALUE bob:k7 0 1|B|END" {
		t.Errorf("the server holds %q", got)
	}

	// Meta: k returns the client's key, plain and in base64 (b).
	if got := roundTrip(t, alice, aliceR, "mg k1 v k\r\n", "A"); strings.Join(got, "|") != "VA 1 kk1|A" {
		t.Errorf("mg k1 v k: %q", got)
	}
	// (memcached 1.6.18 returns a hit's key decoded, without b, and a miss's in base64.)
	if got := roundTrip(t, alice, aliceR, "mg azE= b v k\r\n", "A"); strings.Join(got, "|") != "VA 1 kk1|A" {
		t.Errorf("mg azE= b v k: %q", got)
	}
	if got := roundTrip(t, alice, aliceR, "mg bWlzcw== b v k\r\n", "EN kbWlzcw== b"); strings.Join(got, "|") != "EN kbWlzcw== b" {
		t.Errorf("mg bWlzcw== b v k: %q", got)
	}
	// A route matches the client's key: r:x goes to the other pool, as alice:r:x.
	roundTrip(t, alice, aliceR, "set r:x 0 0 1\r\nR\r\n", "STORED")
	od, odR := dialConn(t, other.Addr)
	if got := roundTrip(t, od, odR, "get alice:r:x\r\n", "END"); strings.Join(got, "|") != "VALUE alice:r:x 0 1|R|END" {
		t.Errorf("the routed pool holds %q", got)
	}
	for req, want := range map[string]string{
		"flush_all\r\n":          "CLIENT_ERROR flush_all not allowed",
		"cache_memlimit 100\r\n": "CLIENT_ERROR cache_memlimit not allowed",
		"stats detail dump\r\n":  "CLIENT_ERROR stats detail not allowed",
		"get " + strings.Repeat("x", 250-len("alice:")+1) + "\r\n": "CLIENT_ERROR key too long with its namespace",
	} {
		if got := roundTrip(t, alice, aliceR, req, "END"); got[0] != want {
			t.Errorf("%.40q: %q, want %q", req, got, want)
		}
	}
	if got := roundTrip(t, alice, aliceR, "get "+strings.Repeat("x", 250-len("alice:"))+"\r\n", "END"); got[0] != "END" {
		t.Errorf("a key that fits with its namespace: %q", got)
	}

	// Binary: getk answers the client's key, and so does a run of getkq.
	c, r := dialConn(t, moxi.addr)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	reqs := binPacket(0x21, 0, nil, "PLAIN", []byte("\x00bob\x00builder"))
	reqs = append(reqs, binPacket(0x0c, 0, nil, "k3", nil)...)
	for i := range 100 {
		reqs = append(reqs, binPacket(0x0d, 0, nil, fmt.Sprintf("k%d", i), nil)...)
	}
	reqs = append(reqs, binPacket(0x0a, 0, nil, "", nil)...)
	if _, err := c.Write(reqs); err != nil {
		t.Fatal(err)
	}
	if op, status, _, _ := readPacket(t, r); op != 0x21 || status != 0 {
		t.Fatalf("SASL auth: opcode %#x status %#x", op, status)
	}
	if op, status, key, value := readPacket(t, r); op != 0x0c || status != 0 || key != "k3" || value != "B" {
		t.Errorf("getk k3: opcode %#x status %#x key %q value %q", op, status, key, value)
	}
	for i := range 100 {
		if op, status, key, value := readPacket(t, r); op != 0x0d || status != 0 || key != fmt.Sprintf("k%d", i) || value != "B" {
			t.Fatalf("getkq %d: opcode %#x status %#x key %q value %q", i, op, status, key, value)
		}
	}
	if op, _, _, _ := readPacket(t, r); op != 0x0a {
		t.Errorf("after the getkq run: opcode %#x, want the noop's", op)
	}
}

// TestAuthReloadAndPacing: a reload that removes a user closes that user's connections and
// no other; failed logins are counted, and a client that keeps failing is answered ever
// later while another logs in and is served meanwhile.
func TestAuthReloadAndPacing(t *testing.T) {
	t.Parallel() // mostly waits (timers, expiries, child tools): beside the other waiting tests
	users := writeUsers(t, "alice:secret", "bob:builder")
	mc := memcachedtest.Start(t)
	admin := freeAddr(t)
	moxi := startMoxi(t, "--config", writeConfig(t, authConfig(users, false, "", mc.Addr)), "--admin", admin)

	alice, aliceR := dialConn(t, moxi.addr)
	bob, bobR := dialConn(t, moxi.addr)
	textLogin(t, alice, aliceR, "alice", "secret")
	textLogin(t, bob, bobR, "bob", "builder")
	// Neither stats settings nor /config shows a password, or where the users file is.
	settings := strings.Join(roundTrip(t, alice, aliceR, "stats settings\r\n", "END"), "\n")
	if !strings.Contains(settings, "auth.namespaces") || strings.Contains(settings, users) || strings.Contains(settings, "secret") {
		t.Errorf("stats settings:\n%s", settings)
	}
	if cfg := getText(t, "http://"+admin+"/config"); !strings.Contains(cfg, users) || strings.Contains(cfg, "secret") || strings.Contains(cfg, "builder") {
		t.Errorf("/config:\n%s", cfg)
	}
	if err := os.WriteFile(users, []byte("alice:secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, body := postReload(t, admin); code != 200 || !strings.Contains(body, "users changed") {
		t.Fatalf("reload: %d %s", code, body)
	}
	_ = bob.SetReadDeadline(time.Now().Add(20 * time.Second))
	if line, err := bobR.ReadString('\n'); err == nil {
		t.Errorf("bob's connection is open after bob was removed: read %q", line)
	}
	roundTrip(t, alice, aliceR, "set still 0 0 1\r\nx\r\n", "STORED")
	c, r := dialConn(t, moxi.addr)
	if got := roundTrip(t, c, r, "set auth 0 0 11\r\nbob builder\r\n", "STORED"); got[0] != "CLIENT_ERROR authentication failure" {
		t.Errorf("a removed user's login: %q", got)
	}

	// Failures in a row: the fifth on is answered only after a wait (auth.Delay), the
	// eighth after 1.6 s, during which another client logs in and is served.
	before := metricValue(t, admin, "moxi_auth_failures_total")
	errorsBefore := metricValue(t, admin, `moxi_error_answers_total{kind="client_error",pool=""}`)
	guesser, guesserR := dialConn(t, moxi.addr)
	for range 7 {
		if got := roundTrip(t, guesser, guesserR, "set auth 0 0 11\r\nalice guess\r\n", "STORED"); got[0] != "CLIENT_ERROR authentication failure" {
			t.Fatalf("a wrong password: %q", got)
		}
	}
	if _, err := guesser.Write([]byte("set auth 0 0 11\r\nalice guess\r\n")); err != nil {
		t.Fatal(err)
	}
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		_ = guesser.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, _ = guesserR.ReadString('\n')
	}()
	other, otherR := dialConn(t, moxi.addr)
	textLogin(t, other, otherR, "alice", "secret")
	roundTrip(t, other, otherR, "set meanwhile 0 0 1\r\nx\r\n", "STORED")
	roundTrip(t, other, otherR, "get meanwhile\r\n", "END")
	select {
	case <-answered:
		t.Error("the eighth failure in a row was answered before another client logged in and was served twice: failures are not paced")
	default:
	}
	<-answered
	if got := metricValue(t, admin, "moxi_auth_failures_total") - before; got != 8 {
		t.Errorf("moxi_auth_failures_total rose by %v, want 8", got)
	}
	if got := metricValue(t, admin, `moxi_error_answers_total{kind="client_error",pool=""}`) - errorsBefore; got != 8 {
		t.Errorf("moxi_error_answers_total{kind=\"client_error\",pool=\"\"} rose by %v, want 8: one per refused login", got)
	}
	if strings.Contains(moxi.out.String(), "guess") {
		t.Error("moxi logged a password")
	}
}
