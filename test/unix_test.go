package test

import (
	"bufio"
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// startMoxiUnix runs moxi listening on the Unix socket at sock, with an admin server,
// and waits until it serves: moxi opens its admin port after its client listener.
func startMoxiUnix(t *testing.T, sock string, args ...string) *process {
	t.Helper()
	admin := freeAddr(t)
	return launch(t, admin, moxiBin, true, append([]string{"--listen", sock, "--admin", admin}, args...))
}

func dialUnix(t *testing.T, sock string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// TestUnixSocket: moxi listens on a Unix socket when listen is a path: it removes the
// socket a previous run left there, makes it mode 0660, serves text, binary and
// gomemcache through it (memccapable cannot reach a socket: it takes a host and a port),
// and removes it when it stops.
func TestUnixSocket(t *testing.T) {
	mcs := cluster(t, 2)
	sock := filepath.Join(t.TempDir(), "moxi.sock")

	// A socket left behind by a run that did not exit cleanly: nobody accepts on it.
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()

	moxi := startMoxiUnix(t, sock, "--config", writeConfig(t, "watch_config: false\n"+poolConfig("", addrs(mcs)...)))
	fi, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o660 {
		t.Errorf("socket mode %v, want a socket with 0660", fi.Mode())
	}

	c, r := dialUnix(t, sock)
	checkText(t, c, r, "unix:text:")
	b, br := dialUnix(t, sock)
	checkBinary(t, b, br, "unix:bin:")
	checkPipeline(t, c, r, "unix:pipe:")
	exerciseGomemcache(t, sock) // gomemcache takes a path for a Unix socket

	moxi.stop(t)
	if _, err := os.Lstat(sock); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket after moxi stopped: %v, want it removed", err)
	}
}

// TestUnixSocketRefusals: moxi does not remove what is not its stale socket: a regular
// file at the path, or a socket another process accepts on. It exits with the reason.
func TestUnixSocketRefusals(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	live := filepath.Join(dir, "live.sock")
	ln, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	for _, tt := range []struct{ path, reason string }{
		{file, "is not a socket"},
		{live, "another process is listening"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := exec.CommandContext(ctx, moxiBin, "--listen", tt.path, "--admin", "").CombinedOutput()
		cancel()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), tt.reason) {
			t.Errorf("moxi --listen %s: %v\n%s\nwant exit 1 saying %q", tt.path, err, out, tt.reason)
		}
	}
	if data, err := os.ReadFile(file); err != nil || string(data) != "precious" {
		t.Errorf("the regular file at the path: %q %v", data, err)
	}
	if _, err := os.Lstat(live); err != nil {
		t.Errorf("the live socket: %v", err)
	}
}
