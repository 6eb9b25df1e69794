package test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestIdleConnectionMemory measures what an idle client connection costs moxi: once idle,
// a connection parks, holding no goroutine and no buffer, only its socket and a small
// record (about 1.5 KiB of RSS in all, measured by bench/held.sh; 10 KiB and more when
// each kept a goroutine). Each held connection is then answered when it speaks again.
func TestIdleConnectionMemory(t *testing.T) {
	t.Parallel() // mostly waits for the connections to park
	const conns = 5000
	const bound = 4 // KiB of RSS per connection: well above what parking costs, well below a goroutine each
	// The race detector multiplies memory, so RSS is measured on a plain build.
	bin := filepath.Join(t.TempDir(), "moxi")
	build := exec.Command("go", "build", "-o", bin, "../cmd/moxi")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	addr, admin := freeAddr(t), freeAddr(t)
	p := start(t, addr, bin, "--listen", addr, "--admin", admin)

	stats, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer stats.Close()
	statsR := bufio.NewReader(stats)
	currConnections(t, stats, statsR) // the stats connection is served before measuring
	goroutines := metricValue(t, admin, "go_goroutines")
	before := vmRSS(t, p.cmd.Process.Pid)

	clients := make([]net.Conn, 0, conns)
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	deadline := time.Now().Add(60 * time.Second)
	get := func(i int, c net.Conn) {
		t.Helper()
		_ = c.SetDeadline(deadline)
		if _, err := fmt.Fprintf(c, "get idle:%d\r\n", i); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		buf := make([]byte, 5)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "END\r\n" {
			t.Fatalf("connection %d: get answered %q, %v", i, buf, err)
		}
	}
	for i := range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		clients = append(clients, c)
		get(i, c)
	}

	// Every client has been answered and is idle: their goroutines end, and the memory they
	// held goes back to the system.
	var perConn, parkedGoroutines float64
	if !poll(60*time.Second, func() bool {
		parkedGoroutines = metricValue(t, admin, "go_goroutines")
		perConn = float64(vmRSS(t, p.cmd.Process.Pid)-before) / conns
		return parkedGoroutines < goroutines+50 && perConn < bound
	}) {
		t.Fatalf("%d idle connections: go_goroutines %.0f (%.0f before), RSS %.2f KiB per connection; want fewer than %.0f and under %d KiB",
			conns, parkedGoroutines, goroutines, perConn, goroutines+50, bound)
	}
	t.Logf("%d idle connections: go_goroutines %.0f (%.0f before), RSS %.2f KiB per connection", conns, parkedGoroutines, goroutines, perConn)
	if cur := currConnections(t, stats, statsR); cur != conns+1 {
		t.Errorf("curr_connections %d, want %d", cur, conns+1)
	}
	for i, c := range clients {
		get(i, c)
	}
}

// vmRSS is the resident set size of process pid, in KiB.
func vmRSS(t *testing.T, pid int) int64 { return procStatus(t, pid, "VmRSS") }

// procStatus is a size field of /proc/pid/status (VmRSS, VmHWM, …), in KiB.
func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(status)) {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("%s line %q: %v", field, line, err)
			}
			return kb
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// currConnections asks moxi's stats for curr_connections.
func currConnections(t *testing.T, c net.Conn, r *bufio.Reader) int {
	t.Helper()
	for _, line := range roundTrip(t, c, r, "stats\r\n", "END") {
		if v, ok := strings.CutPrefix(line, "STAT curr_connections "); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("curr_connections %q", v)
			}
			return n
		}
	}
	t.Fatal("stats has no curr_connections")
	return 0
}
