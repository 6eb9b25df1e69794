// Package test holds moxi's end-to-end tests: the moxi binary, real memcached processes and
// real clients, all on loopback ports chosen at run time.
package test

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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

	// moxi marks a moxi binary: when it stops, a data race it reported fails the test
	// (see checkRace). memcached and nutcracker are not checked.
	moxi bool

	exited  chan struct{} // closed by the goroutine that waits for the process
	waitErr error         // what Wait returned; read after exited is closed
	stopped sync.Once
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
	return launch(t, addr, name, false, args)
}

// launch is start; moxi says whether the process is a moxi to check for data races.
func launch(t testing.TB, addr, name string, moxi bool, args []string) *process {
	t.Helper()
	p := spawn(t, addr, name, moxi, args)
	if err := p.waitListening(20 * time.Second); err != nil {
		t.Fatalf("%s on %s: %v\n%s", name, addr, err, p.out.String())
	}
	return p
}

// startMoxiNoWait starts the suite's moxi listening on listen, without waiting for it to.
func startMoxiNoWait(t testing.TB, listen string, args ...string) *process {
	t.Helper()
	return spawn(t, listen, moxiBin, true, append([]string{"--listen", listen}, args...))
}

// spawn starts name with args; addr is where it will listen.
func spawn(t testing.TB, addr, name string, moxi bool, args []string) *process {
	t.Helper()
	cmd := exec.Command(name, args...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &process{cmd: cmd, addr: addr, out: out, moxi: moxi, exited: make(chan struct{})}
	// Waiting from the start reaps a process that dies early, so that stop still learns
	// how it ended (a race report with halt_on_error exits 66 at once). The goroutine ends
	// when the process does; stop makes sure it does.
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() { p.stop(t) })
	return p
}

// waitListening waits until p's address accepts connections, up to timeout, and gives up
// at once if p exits.
func (p *process) waitListening(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", p.addr, 100*time.Millisecond)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not listening after %v: %w", timeout, err)
		}
		select {
		case <-p.exited:
			return fmt.Errorf("exited before listening: %v", p.waitErr)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// stop sends SIGTERM, waits up to 10 s, then kills; for a moxi it then checks for data
// races. Calls after the first do nothing.
func (p *process) stop(t testing.TB) {
	p.stopped.Do(func() {
		select {
		case <-p.exited:
			// It ended before the test did; checkRace tells whether a race is why.
			t.Logf("%s exited before the test ended: %v", p.cmd.Path, p.waitErr)
		default:
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.exited:
			case <-time.After(10 * time.Second):
				_ = p.cmd.Process.Kill()
				<-p.exited
				t.Errorf("%s did not stop on SIGTERM within 10s", p.cmd.Path)
			}
		}
		if p.moxi {
			p.checkRace(t)
		}
	})
}

// raceExitCode is the race detector's exit status for a program that reported a race
// (GORACE exitcode, default 66).
const raceExitCode = 66

// maxRaceExcerpt bounds how much of a process's output a race failure quotes.
const maxRaceExcerpt = 8 << 10

// checkRace fails the test if the process reported a data race: a "WARNING: DATA RACE"
// in its output (printed whenever one is found), or the race detector's exit status (it
// replaces a clean exit's 0 with 66 when races were reported). Called once p has exited.
func (p *process) checkRace(t testing.TB) {
	out := p.out.String()
	reports := strings.Count(out, "WARNING: DATA RACE")
	var ee *exec.ExitError
	code66 := errors.As(p.waitErr, &ee) && ee.ExitCode() == raceExitCode
	if reports == 0 && !code66 {
		return
	}
	var excerpt string
	if i := strings.Index(out, "WARNING: DATA RACE"); i >= 0 {
		excerpt = out[i:] // from the first report on
		if len(excerpt) > maxRaceExcerpt {
			excerpt = excerpt[:maxRaceExcerpt] + fmt.Sprintf("\n... (%d more bytes)", len(excerpt)-maxRaceExcerpt)
		}
	} else {
		excerpt = out[max(0, len(out)-maxRaceExcerpt):] // the end, where the exit was explained
	}
	t.Errorf("%s reported a data race (%d race warnings, exit: %v):\n%s", p.cmd.Path, reports, p.waitErr, excerpt)
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
	for slices.Contains(args, addr) { // an --admin address, picked the same way, can come back
		addr = freeAddr(t)
	}
	all := append([]string{"--listen", addr}, args...)
	if !containsFlag(args, "--admin") {
		all = append(all, "--admin", "")
	}
	p := launch(t, addr, bin, true, all)
	if admin := flagValue(args, "--admin"); admin != "" {
		// The admin port opens beside the data port, not before it: tests that read it
		// first wait for it too.
		if err := memcachedtest.WaitListening(admin, 20*time.Second); err != nil {
			t.Fatalf("moxi's admin on %s: %v\n%s", admin, err, p.out.String())
		}
	}
	return p
}

// flagValue is the value of flag in args ("--flag value" or "--flag=value"), or "".
func flagValue(args []string, flag string) string {
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v
		}
	}
	return ""
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
