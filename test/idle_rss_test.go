package test

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestIdleConnectionMemory measures what an idle client connection costs moxi: a served
// connection that waits for its next request should hold no read or write buffer, only its
// goroutine and socket.
func TestIdleConnectionMemory(t *testing.T) {
	const conns = 5000
	// The race detector multiplies memory, so RSS is measured on a plain build.
	bin := filepath.Join(t.TempDir(), "moxi")
	build := exec.Command("go", "build", "-o", bin, "../cmd/moxi")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	addr := freeAddr(t)
	p := start(t, addr, bin, "--listen", addr, "--admin", "")

	admin, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	adminR := bufio.NewReader(admin)
	currConnections(t, admin, adminR) // the admin connection is served before measuring
	before := vmRSS(t, p.cmd.Process.Pid)

	clients := make([]net.Conn, 0, conns)
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	buf := make([]byte, 64)
	deadline := time.Now().Add(15 * time.Second)
	for range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d: %v", len(clients), err)
		}
		clients = append(clients, c)
		_ = c.SetDeadline(deadline)
		if _, err := c.Write([]byte("version\r\n")); err != nil {
			t.Fatal(err)
		}
		n, err := c.Read(buf)
		if err != nil || !strings.HasPrefix(string(buf[:n]), "VERSION ") {
			t.Fatalf("connection %d: version answered %q, %v", len(clients), buf[:n], err)
		}
	}

	// Every client has been answered; stats confirms the server counts them all open.
	want := conns + 1 // and the admin connection
	var cur int
	for cur != want {
		if time.Now().After(deadline) {
			t.Fatalf("curr_connections %d, want %d", cur, want)
		}
		cur = currConnections(t, admin, adminR)
	}
	after := vmRSS(t, p.cmd.Process.Pid)

	perConn := float64(after-before) / conns
	t.Logf("idle connections: %d, RSS before %.1f MiB, after %.1f MiB, per connection %.1f KiB",
		conns, float64(before)/1024, float64(after)/1024, perConn)
	if perConn >= 64 {
		t.Errorf("an idle connection costs %.1f KiB of RSS, want under 64 KiB", perConn)
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
