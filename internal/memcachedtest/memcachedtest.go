// Package memcachedtest gives tests memcached servers on free loopback ports — real
// memcached processes, or one that never answers — and stops them when the test ends.
package memcachedtest

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

// Server is a running memcached.
type Server struct {
	Addr string
	cmd  *exec.Cmd
	out  *strings.Builder
	args []string
}

// Start runs memcached with extra arguments on a free loopback port. A missing memcached
// fails the test: the suite's `make test` installs it.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	return StartAt(t, FreeAddr(t), extra...)
}

// StartAt is Start on addr, a loopback host:port that is free: servers on 127.0.0.2,
// 127.0.0.3… sharing a port are what the A records of one name give.
func StartAt(t testing.TB, addr string, extra ...string) *Server {
	t.Helper()
	return startAt(t, addr, nil, extra)
}

// startAt is StartAt with env added to memcached's environment.
func startAt(t testing.TB, addr string, env, extra []string) *Server {
	t.Helper()
	bin, err := exec.LookPath("memcached")
	if err != nil {
		t.Fatal("memcached not found: run `make deps` (or `make test`, which installs it)")
	}
	s := &Server{Addr: addr}
	host, port, _ := net.SplitHostPort(s.Addr)
	s.args = append([]string{"-u", "nobody", "-l", host, "-p", port, "-U", "0", "-m", "64"}, extra...)
	s.cmd = exec.Command(bin, s.args...)
	if env != nil {
		s.cmd.Env = append(os.Environ(), env...)
	}
	s.start(t)
	t.Cleanup(func() { s.Stop() })
	return s
}

func (s *Server) start(t testing.TB) {
	t.Helper()
	s.out = &strings.Builder{}
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start memcached: %v", err)
	}
	if err := WaitListening(s.Addr, 10*time.Second); err != nil {
		s.Stop()
		t.Fatalf("memcached %s: %v\n%s", s.Addr, err, s.out.String())
	}
}

// Restart starts the server again on the same port after Stop or Kill. A server still
// running is stopped first: a second process could not bind the port, and the first, no
// longer s.cmd, would outlive the test.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Stop()
	env := s.cmd.Env
	s.cmd = exec.Command(s.cmd.Path, s.args...)
	s.cmd.Env = env
	s.start(t)
}

// Stop kills the process and waits for it; safe to call twice.
func (s *Server) Stop() {
	if s.cmd.Process == nil || s.cmd.ProcessState != nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}

// Signal sends sig (e.g. SIGSTOP, SIGCONT) to the process.
func (s *Server) Signal(sig syscall.Signal) error {
	return s.cmd.Process.Signal(sig)
}

// Pause stops the process (SIGSTOP) and returns once the kernel reports it stopped: the
// signal is delivered asynchronously, and a request sent before it lands is answered.
func (s *Server) Pause(t testing.TB) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stat := fmt.Sprintf("/proc/%d/stat", s.cmd.Process.Pid)
	for deadline := time.Now().Add(10 * time.Second); ; {
		b, err := os.ReadFile(stat)
		// The state follows the command's closing parenthesis: "pid (memcached) T …".
		if _, after, ok := strings.Cut(string(b), ") "); err == nil && ok && strings.HasPrefix(after, "T") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("memcached %s not stopped 10 s after SIGSTOP", s.Addr)
		}
		time.Sleep(time.Millisecond)
	}
}

// Pid is the process's id, for reading what it costs (/proc).
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// FreeAddr is a loopback address whose port was free a moment ago.
//
// Its port is below the kernel's ephemeral range (32768 and up on Linux), where nothing
// else takes ports unasked: a port the kernel chose for a listener and freed again may be
// taken the next moment by any outgoing connection (a moxi dialing its servers), before
// the test's process binds it. Each test process walks the range from its own place.
func FreeAddr(t testing.TB) string {
	t.Helper()
	for range freePorts {
		port := firstFreePort + int(nextFreePort.Add(1))%freePorts
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue // taken: the next one
		}
		defer ln.Close()
		return ln.Addr().String()
	}
	t.Fatalf("no free port in %d–%d", firstFreePort, firstFreePort+freePorts-1)
	return ""
}

// The ports FreeAddr hands out: [firstFreePort, firstFreePort+freePorts), from a place that
// depends on the process, so that test processes running at once start far apart.
const firstFreePort, freePorts = 20000, 12000

var nextFreePort = func() *atomic.Int64 {
	var n atomic.Int64
	n.Store(int64(os.Getpid()) * 1009 % freePorts)
	return &n
}()

// WaitListening waits until addr accepts a connection.
func WaitListening(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not listening after %v: %w", timeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Stats is the server's "stats" as a map, read over a fresh text connection.
func Stats(t testing.TB, addr string) map[string]string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("stats\r\n")); err != nil {
		t.Fatal(err)
	}
	stats := map[string]string{}
	var buf strings.Builder
	b := make([]byte, 4096)
	for !strings.HasSuffix(buf.String(), "END\r\n") {
		n, err := c.Read(b)
		if err != nil {
			t.Fatalf("stats from %s: %v", addr, err)
		}
		buf.Write(b[:n])
	}
	for _, line := range strings.Split(buf.String(), "\r\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "STAT" {
			stats[f[1]] = f[2]
		}
	}
	return stats
}

// Fake is a loopback server whose every connection serve handles: a server that
// misbehaves as the test needs. A connection stays open when serve returns, until the test
// ends; then the listener and every connection are closed, and Fake waits for serve to
// return.
type Fake struct {
	Addr    string
	accepts atomic.Int32
}

// Accepts is the number of connections accepted so far.
func (f *Fake) Accepts() int { return int(f.accepts.Load()) }

// StartFake starts a Fake.
func StartFake(t testing.TB, serve func(c net.Conn)) *Fake {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &Fake{Addr: ln.Addr().String()}
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.accepts.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				serve(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return f
}

// Blackhole is the address of a loopback server that accepts connections and never
// answers nor reads (a server that hangs); it closes with the test.
func Blackhole(t testing.TB) string {
	t.Helper()
	return StartFake(t, func(net.Conn) {}).Addr
}

// BinaryHeader is the header of a binary-protocol answer to req, as a server that may lie
// would send it: magic, status, extras length and body length as given.
func BinaryHeader(req *protocol.Request, magic byte, status uint16, extLen uint8, bodyLen uint32) []byte {
	h := make([]byte, 24)
	h[0], h[1], h[4] = magic, req.Opcode, extLen
	binary.BigEndian.PutUint16(h[6:], status)
	binary.BigEndian.PutUint32(h[8:], bodyLen)
	binary.BigEndian.PutUint32(h[12:], req.Opaque)
	return h
}

// ReadableDir is a temporary directory, removed when the test ends, that every user may
// read: memcached reads the files a test gives it (-Y's, -S's) after it has become nobody.
// (t.TempDir's is inside one only its owner may enter.)
func ReadableDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "memcachedtest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// StartSASL runs memcached -S (binary protocol only, every request after SASL PLAIN
// authentication) on a free loopback port, checking passwords against users (name →
// password) in a Cyrus sasldb written for the test: a SASL_CONF_PATH directory holding
// memcached.conf ("mech_list: plain" and the database's path), and the database, written by
// Python's dbm.ndbm (Berkeley DB, as Debian's libsasl2 reads) with the entries
// "user\0<host name>\0userPassword" that saslpasswd2 would write.
func StartSASL(t testing.TB, users map[string]string, extra ...string) *Server {
	t.Helper()
	env := []string{"SASL_CONF_PATH=" + SASLConfDir(t, users)} // read by memcached's libsasl2
	return startAt(t, FreeAddr(t), env, append([]string{"-S"}, extra...))
}

// SASLConfDir writes a SASL_CONF_PATH directory for memcached -S checking users (see
// StartSASL) and returns its path. The directory and files are readable by every user:
// memcached reads the database after it has become nobody.
func SASLConfDir(t testing.TB, users map[string]string) string {
	t.Helper()
	dir := ReadableDir(t)
	db := filepath.Join(dir, "sasldb")
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	// The script reads "user password" lines: names and passwords in tests have no spaces.
	var lines strings.Builder
	for u, p := range users {
		fmt.Fprintf(&lines, "%s %s\n", u, p)
	}
	script := `import dbm.ndbm, sys
db = dbm.ndbm.open(sys.argv[1], 'n', 0o644)
for line in sys.stdin.read().splitlines():
    user, password = line.split(' ', 1)
    db[user.encode() + b'\0' + sys.argv[2].encode() + b'\0userPassword'] = password.encode()
db.close()
`
	cmd := exec.Command("/usr/bin/python3", "-c", script, db, host)
	cmd.Stdin = strings.NewReader(lines.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("write sasldb: %v\n%s", err, out)
	}
	conf := fmt.Sprintf("mech_list: plain\nsasldb_path: %s.db\n", db)
	if err := os.WriteFile(filepath.Join(dir, "memcached.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(db+".db", 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}
