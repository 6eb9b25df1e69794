// Package test holds moxi's end-to-end tests: the moxi binary, real memcached processes and
// real clients, all on loopback ports chosen at run time.
package test

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// moxiBin is the moxi binary built once by TestMain, with the race detector.
var moxiBin string

// fastBin is moxi built without the race detector, for tests that time answers; built on
// first use.
var (
	fastBin     string
	fastBinOnce sync.Once
	fastBinErr  error
)

func fastMoxi(t testing.TB) string {
	t.Helper()
	fastBinOnce.Do(func() {
		fastBin = filepath.Join(filepath.Dir(moxiBin), "moxi-fast")
		out, err := exec.Command("go", "build", "-o", fastBin, "../cmd/moxi").CombinedOutput()
		if err != nil {
			fastBinErr = fmt.Errorf("building moxi: %v\n%s", err, out)
		}
	})
	if fastBinErr != nil {
		t.Fatal(fastBinErr)
	}
	return fastBin
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "moxi-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	moxiBin = filepath.Join(dir, "moxi")
	build := exec.Command("go", "build", "-race", "-o", moxiBin, "../cmd/moxi")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building moxi:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr(t testing.TB) string { return memcachedtest.FreeAddr(t) }

// requireBinary fails (never skips) when a tool the suite needs is missing: `make test`
// installs them.
func requireBinary(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s not found: run `make deps` (or `make test`, which installs it)", name)
	}
	return path
}

// process is a child process stopped at the end of the test.
type process struct {
	cmd  *exec.Cmd
	addr string
	out  *syncBuffer
}

// syncBuffer collects a process's output, which os/exec writes from its own goroutine
// while the test may read it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs name with args and waits until addr accepts connections.
func start(t testing.TB, addr, name string, args ...string) *process {
	t.Helper()
	cmd := exec.Command(name, args...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &process{cmd: cmd, addr: addr, out: out}
	t.Cleanup(func() { p.stop(t) })
	if err := memcachedtest.WaitListening(addr, 10*time.Second); err != nil {
		t.Fatalf("%s on %s: %v\n%s", name, addr, err, out.String())
	}
	return p
}

// stop sends SIGTERM, waits up to 10 s, then kills.
func (p *process) stop(t testing.TB) {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
		t.Errorf("%s did not stop on SIGTERM within 10s", p.cmd.Path)
	}
}

// startMoxi runs the moxi binary with args plus a free --listen address and no admin server
// unless args name one.
func startMoxi(t testing.TB, args ...string) *process {
	t.Helper()
	return startMoxiBin(t, moxiBin, args...)
}

// startMoxiBin is startMoxi for a given binary.
func startMoxiBin(t testing.TB, bin string, args ...string) *process {
	t.Helper()
	addr := freeAddr(t)
	all := append([]string{"--listen", addr}, args...)
	if !containsFlag(args, "--admin") {
		all = append(all, "--admin", "")
	}
	return start(t, addr, bin, all...)
}

func containsFlag(args []string, flag string) bool {
	for _, a := range args {
		if a == flag || strings.HasPrefix(a, flag+"=") {
			return true
		}
	}
	return false
}

// roundTrip sends a raw request and reads lines until one of them equals last.
func roundTrip(t testing.TB, c net.Conn, r *bufio.Reader, req, last string) []string {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("after %q: %v (got %q)", req, err, lines)
		}
		line = strings.TrimSuffix(line, "\r\n")
		lines = append(lines, line)
		if line == last || strings.HasPrefix(line, "SERVER_ERROR") || strings.HasPrefix(line, "CLIENT_ERROR") || line == "ERROR" {
			return lines
		}
	}
}
