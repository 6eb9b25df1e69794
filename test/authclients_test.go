package test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// Real memcached clients that authenticate with SASL PLAIN over the binary protocol, to
// run against an address: spymemcached (Java), libmemcached's tools, and raw binary
// requests. TestAuthClientsAgainstMemcachedSASL checks them against memcached -S.

// spymemcachedJar is Debian's libspymemcached-java (scripts/install-deps.sh installs it);
// it needs no other jar.
const spymemcachedJar = "/usr/share/java/spymemcached.jar"

// spyAuthSource is the Java program runSpymemcached runs.
const spyAuthSource = "testdata/spyauth/SpyAuth.java"

// spyAuthLimit bounds one run of SpyAuth; the program bounds itself at 50 s (10 s to
// authenticate).
const spyAuthLimit = 60 * time.Second

// errSpyAuthFailed is what runSpymemcached's error wraps when spymemcached did not
// authenticate (SpyAuth's exit status 2).
var errSpyAuthFailed = errors.New("spymemcached: auth failed")

var (
	spyAuthOnce    sync.Once
	spyAuthClasses string // the directory SpyAuth.class was compiled into
	spyAuthErr     error
)

// compileSpyAuth compiles SpyAuth.java, once per run of the test binary, into the
// directory TestMain removes at the end, and returns the classes' directory.
func compileSpyAuth(t testing.TB) string {
	t.Helper()
	javac := requireBinary(t, "javac")
	spyAuthOnce.Do(func() {
		dir := filepath.Join(filepath.Dir(moxiBin), "spyauth")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			spyAuthErr = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, javac, "-encoding", "UTF-8", "-cp", spymemcachedJar, "-d", dir, spyAuthSource)
		if out, err := cmd.CombinedOutput(); err != nil {
			spyAuthErr = fmt.Errorf("javac %s: %v\n%s", spyAuthSource, err, out)
			return
		}
		spyAuthClasses = dir
	})
	if spyAuthErr != nil {
		t.Fatal(spyAuthErr)
	}
	return spyAuthClasses
}

// runSpymemcached runs spymemcached's client (testdata/spyauth/SpyAuth.java) against addr
// over the binary protocol, authenticating with SASL PLAIN as user: memccapable-style checks
// (set/get, add, replace, delete, incr/decr, append/prepend, cas, touch, a 100-key bulk get,
// a 512 KB value), each printing "ok <name>" or "FAIL <name>: <why>", then "PASS: ..." or
// "FAIL: ...". It returns the program's output (with spymemcached's own log on stderr) and
// an error when a check failed or the program did not end well; the error wraps
// errSpyAuthFailed when authentication did not succeed, which the program sees at once for
// a refused password (spymemcached drops the connection) and gives up on after 10 s for a
// server that does not answer. A run takes about 0.5 s; the first in a test binary compiles
// the program first (about 1.5 s). A missing java, javac or spymemcached fails the test.
func runSpymemcached(t testing.TB, addr, user, password string) (string, error) {
	t.Helper()
	java := requireBinary(t, "java")
	if _, err := os.Stat(spymemcachedJar); err != nil {
		t.Fatalf("spymemcached: %v: run `make deps` (or `make test`; scripts/install-deps.sh installs libspymemcached-java)", err)
	}
	classes := compileSpyAuth(t)
	ctx, cancel := context.WithTimeout(context.Background(), spyAuthLimit)
	defer cancel()
	// Tiered compilation stopped at C1 and the serial collector: a short run starts faster.
	cmd := exec.CommandContext(ctx, java, "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
		"-cp", spymemcachedJar+string(os.PathListSeparator)+classes, "SpyAuth", addr, user, password)
	cmd.WaitDelay = 5 * time.Second
	// The client's report is on stdout, the JVM's log on stderr: kept apart, a log line
	// written at the same instant cannot split the PASS line (both are shown on failure).
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	out := append(stdout.Bytes(), stderr.Bytes()...)
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		err = fmt.Errorf("spymemcached against %s: not done after %v: %v", addr, spyAuthLimit, err)
	case errors.As(err, &ee) && ee.ExitCode() == 2:
		err = fmt.Errorf("%w: %s as %s", errSpyAuthFailed, addr, user)
	case err != nil:
		err = fmt.Errorf("spymemcached against %s: %v", addr, err)
	case !bytes.Contains(append([]byte("\n"), stdout.Bytes()...), []byte("\nPASS: ")):
		err = fmt.Errorf("spymemcached against %s: exited 0 without its PASS line", addr)
	}
	return string(out), err
}

// memcToolsLimit bounds each run of one of libmemcached's tools.
const memcToolsLimit = 20 * time.Second

// runMemcTools runs libmemcached's tools against addr over the binary protocol,
// authenticating with SASL PLAIN as user: memccp copies files (one of 100 KB, one holding
// every byte value) to keys named after them (unique to the call), memccat reads each back
// into a file to compare bytes with, memcexist and memctouch find them, memcrm removes them,
// and then memccat and memcexist must fail. It returns an error describing the first step
// that did not go so, with the tool's output; with a refused password that is the first
// memccp, which fails at once ("AUTHENTICATION FAILURE"). A missing tool fails the test.
func runMemcTools(t testing.TB, addr, user, password string) error {
	t.Helper()
	bins := make(map[string]string)
	for _, name := range []string{"memccp", "memccat", "memcexist", "memctouch", "memcrm"} {
		bins[name] = requireBinary(t, name)
	}
	dir := t.TempDir()
	tag := fmt.Sprintf("authtools-%d", time.Now().UnixNano())
	big := make([]byte, 100<<10)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	every := make([]byte, 512)
	for i := range every {
		every[i] = byte(i)
	}
	files := []struct {
		key  string
		data []byte
	}{
		{tag + "-small.txt", []byte("hello, authenticated world\n")},
		{tag + "-100k.bin", big},
		{tag + "-bytes.bin", every},
	}
	var keys, paths []string
	for _, f := range files {
		path := filepath.Join(dir, f.key)
		if err := os.WriteFile(path, f.data, 0o644); err != nil {
			t.Fatal(err)
		}
		keys, paths = append(keys, f.key), append(paths, path)
	}
	// run runs a tool, its options before the positional arguments (which getopt on GNU
	// wants).
	run := func(name string, args ...string) error {
		ctx, cancel := context.WithTimeout(context.Background(), memcToolsLimit)
		defer cancel()
		all := append([]string{"--servers=" + addr, "--binary", "-u", user, "-p", password}, args...)
		cmd := exec.CommandContext(ctx, bins[name], all...)
		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.CombinedOutput()
		if ctx.Err() != nil {
			return fmt.Errorf("%s %s: not done after %v: %v\n%s", name, strings.Join(args, " "), memcToolsLimit, err, out)
		}
		if err != nil {
			return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := run("memccp", paths...); err != nil {
		return err
	}
	for _, f := range files {
		out := filepath.Join(dir, "got-"+f.key)
		if err := run("memccat", "--file="+out, f.key); err != nil {
			return err
		}
		got, err := os.ReadFile(out)
		if err != nil {
			return fmt.Errorf("memccat %s wrote no file: %v", f.key, err)
		}
		if !bytes.Equal(got, f.data) {
			return fmt.Errorf("memccat %s: %d bytes, want the %d memccp stored (first difference at byte %d)",
				f.key, len(got), len(f.data), firstDifferentByte(got, f.data))
		}
	}
	if err := run("memcexist", keys...); err != nil {
		return err
	}
	if err := run("memctouch", append([]string{"--expire=3600"}, keys...)...); err != nil {
		return err
	}
	if err := run("memcrm", keys...); err != nil {
		return err
	}
	for _, key := range keys {
		if err := run("memccat", "--file="+filepath.Join(dir, "gone-"+key), key); err == nil {
			return fmt.Errorf("memccat %s succeeded after memcrm", key)
		}
		if err := run("memcexist", key); err == nil {
			return fmt.Errorf("memcexist %s succeeded after memcrm", key)
		}
	}
	return nil
}

// firstDifferentByte is the index of the first byte where a and b differ (the shorter's
// length when one is a prefix of the other).
func firstDifferentByte(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// Binary-protocol SASL opcodes and statuses.
const (
	opSASLListMechs = 0x20
	opSASLAuth      = 0x21
	opSASLStep      = 0x22

	statusAuthError    = 0x20 // authentication required, or refused
	statusAuthContinue = 0x21
)

// saslLimit bounds one SASL exchange of the raw helpers.
const saslLimit = 10 * time.Second

// saslListMechs sends SASL list mechanisms (opcode 0x20) on conn, a binary-protocol
// connection, and returns the mechanisms the answer lists, space-separated (memcached -S
// answers "PLAIN" when its sasl configuration says mech_list: plain). A status other than
// success is an error. conn's deadline is set for the exchange (10 s) and cleared after.
func saslListMechs(conn net.Conn) (string, error) {
	status, body, err := saslExchange(conn, opSASLListMechs, "", nil)
	if err != nil {
		return "", err
	}
	if status != 0 {
		return "", fmt.Errorf("SASL list mechs: status %#x: %q", status, body)
	}
	return string(body), nil
}

// saslAuthPlain authenticates conn, a binary-protocol connection, with SASL PLAIN (opcode
// 0x21, key "PLAIN", value "\x00user\x00password") and returns the answer's status: 0
// authenticated, 0x20 (statusAuthError) refused. err is for a failed exchange: I/O, or an
// answer that is not one to the request. conn's deadline is set for the exchange (10 s) and
// cleared after.
func saslAuthPlain(conn net.Conn, user, password string) (status uint16, err error) {
	status, _, err = saslAuth(conn, "PLAIN", []byte("\x00"+user+"\x00"+password))
	return status, err
}

// saslAuth is SASL auth (opcode 0x21) with any mechanism and initial data; it returns the
// answer's status and body ("Authenticated" or "Auth failure." from memcached 1.6).
func saslAuth(conn net.Conn, mech string, data []byte) (status uint16, body []byte, err error) {
	return saslExchange(conn, opSASLAuth, mech, data)
}

// saslExchange sends one binary request with key and value (no extras) and reads its
// answer, which must be a response (magic 0x81) to the same opcode and opaque.
func saslExchange(conn net.Conn, opcode uint8, key string, value []byte) (status uint16, body []byte, err error) {
	if err := conn.SetDeadline(time.Now().Add(saslLimit)); err != nil {
		return 0, nil, err
	}
	defer conn.SetDeadline(time.Time{})
	const opaque = 0x5a51a5a5
	if _, err := conn.Write(binPacket(opcode, opaque, nil, key, value)); err != nil {
		return 0, nil, fmt.Errorf("SASL request %#x: %w", opcode, err)
	}
	// Read from conn itself, not through a buffer: what follows the answer stays in conn
	// for the caller.
	hdr := make([]byte, 24)
	if _, err := io.ReadFull(conn, hdr); err != nil {
		return 0, nil, fmt.Errorf("SASL answer to %#x: %w", opcode, err)
	}
	bodyLen := binary.BigEndian.Uint32(hdr[8:12])
	if hdr[0] != 0x81 || hdr[1] != opcode || binary.BigEndian.Uint32(hdr[12:16]) != opaque || bodyLen > 1<<20 {
		return 0, nil, fmt.Errorf("SASL answer to %#x: not one: header % x", opcode, hdr)
	}
	full := make([]byte, bodyLen)
	if _, err := io.ReadFull(conn, full); err != nil {
		return 0, nil, fmt.Errorf("SASL answer to %#x: body: %w", opcode, err)
	}
	skip := int(hdr[4]) + int(binary.BigEndian.Uint16(hdr[2:4])) // extras and key
	if skip > len(full) {
		return 0, nil, fmt.Errorf("SASL answer to %#x: extras and key longer than the body: header % x", opcode, hdr)
	}
	return binary.BigEndian.Uint16(hdr[6:8]), full[skip:], nil
}

// binaryStatus sends one binary request with a key on conn and returns the answer's
// status, for checking whether a connection may work yet.
func binaryStatus(conn net.Conn, opcode uint8, key string) (uint16, error) {
	status, _, err := saslExchange(conn, opcode, key, nil)
	return status, err
}

// TestAuthClientsAgainstMemcachedSASL checks the authenticating clients above against
// memcached -S: with the right password every one works; with a wrong one spymemcached and
// libmemcached's tools fail, and at once.
func TestAuthClientsAgainstMemcachedSASL(t *testing.T) {
	mc := memcachedtest.StartSASL(t, map[string]string{"alice": "secret"})

	t.Run("raw binary", func(t *testing.T) {
		dial := func() net.Conn {
			t.Helper()
			c, err := net.DialTimeout("tcp", mc.Addr, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		}
		c := dial()
		mechs, err := saslListMechs(c)
		if err != nil || !strings.Contains(" "+mechs+" ", " PLAIN ") {
			t.Fatalf("list mechs: %q, %v; want PLAIN among them", mechs, err)
		}
		if status, err := saslAuthPlain(c, "alice", "wrong"); err != nil || status != statusAuthError {
			t.Errorf("PLAIN with a wrong password: status %#x, %v; want %#x", status, err, statusAuthError)
		}
		// A refused password leaves the connection open for another try.
		if status, body, err := saslAuth(c, "PLAIN", []byte("\x00alice\x00secret")); err != nil || status != 0 {
			t.Fatalf("PLAIN after a refusal: status %#x %q, %v; want 0", status, body, err)
		}
		// Authenticated, a get of a missing key is a miss (1), not refused.
		if status, err := binaryStatus(c, 0x00, "authclients:nokey"); err != nil || status != 1 {
			t.Errorf("get after auth: status %#x, %v; want 0x1 (not found)", status, err)
		}
		// Not authenticated, a get is refused (and memcached then closes the connection).
		if status, err := binaryStatus(dial(), 0x00, "authclients:nokey"); err != nil || status != statusAuthError {
			t.Errorf("get before auth: status %#x, %v; want %#x", status, err, statusAuthError)
		}
		if status, err := saslAuthPlain(dial(), "alice", "secret"); err != nil || status != 0 {
			t.Errorf("saslAuthPlain: status %#x, %v; want 0", status, err)
		}
	})

	t.Run("spymemcached", func(t *testing.T) {
		start := time.Now()
		out, err := runSpymemcached(t, mc.Addr, "alice", "secret")
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		t.Logf("spymemcached passed in %v", time.Since(start).Round(time.Millisecond))
	})

	t.Run("spymemcached wrong password", func(t *testing.T) {
		start := time.Now()
		out, err := runSpymemcached(t, mc.Addr, "alice", "wrong")
		took := time.Since(start)
		if !errors.Is(err, errSpyAuthFailed) || !strings.Contains(out, "auth failed") {
			t.Fatalf("got %v, want %v\n%s", err, errSpyAuthFailed, out)
		}
		// A refused password ends the run at once, not at the 10 s bound.
		if took > 8*time.Second {
			t.Errorf("failed after %v, want at once\n%s", took, out)
		}
		t.Logf("spymemcached refused in %v", took.Round(time.Millisecond))
	})

	t.Run("memc tools", func(t *testing.T) {
		start := time.Now()
		if err := runMemcTools(t, mc.Addr, "alice", "secret"); err != nil {
			t.Fatal(err)
		}
		t.Logf("libmemcached tools passed in %v", time.Since(start).Round(time.Millisecond))
	})

	t.Run("memc tools wrong password", func(t *testing.T) {
		start := time.Now()
		err := runMemcTools(t, mc.Addr, "alice", "wrong")
		took := time.Since(start)
		if err == nil || !strings.Contains(err.Error(), "AUTHENTICATION FAILURE") {
			t.Fatalf("got %v, want memccp's AUTHENTICATION FAILURE", err)
		}
		if took > 5*time.Second {
			t.Errorf("failed after %v, want at once", took)
		}
		t.Logf("libmemcached tools refused in %v", took.Round(time.Millisecond))
	})
}
