package sdnotify

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// manager listens as systemd does on NOTIFY_SOCKET and returns the next datagram it gets.
func manager(t *testing.T, name string) func() string {
	t.Helper()
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return func() string {
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 4096)
		n, _, err := conn.ReadFrom(buf)
		if err != nil {
			t.Fatal(err)
		}
		return string(buf[:n])
	}
}

func TestNotifyTo(t *testing.T) {
	for _, tc := range []struct {
		name, socket string
	}{
		{"path", filepath.Join(t.TempDir(), "notify")},
		{"abstract", fmt.Sprintf("@moxi-sdnotify-test-%d", os.Getpid())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			next := manager(t, tc.socket)
			for _, state := range []string{Ready, MainPID(123) + "\n" + Ready, Reloading, Stopping} {
				if err := NotifyTo(tc.socket, state); err != nil {
					t.Fatal(err)
				}
				if got := next(); got != state {
					t.Errorf("got %q, want %q", got, state)
				}
			}
		})
	}
}

func TestNotifyReadsEnvironment(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "notify")
	next := manager(t, socket)
	t.Setenv("NOTIFY_SOCKET", socket)
	if err := Notify(Ready); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != Ready {
		t.Errorf("got %q", got)
	}

	t.Setenv("NOTIFY_SOCKET", "")
	if err := Notify(Ready); err != nil {
		t.Errorf("without NOTIFY_SOCKET: %v, want nothing done", err)
	}
}

func TestNotifyToErrors(t *testing.T) {
	for _, tc := range []struct{ name, socket, state string }{
		{"relative path", "notify.sock", Ready},
		{"nobody listening", filepath.Join(t.TempDir(), "none"), Ready},
		{"empty state", "/run/systemd/notify", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := NotifyTo(tc.socket, tc.state); err == nil {
				t.Error("no error")
			}
		})
	}
}

func TestStripListenEnv(t *testing.T) {
	got := StripListenEnv([]string{"PATH=/bin", "LISTEN_PID=1", "LISTEN_FDS=2", "LISTEN_FDNAMES=a:b", "LISTEN_FDSX=1", "HOME=/"})
	if want := []string{"PATH=/bin", "LISTEN_FDSX=1", "HOME=/"}; !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}
