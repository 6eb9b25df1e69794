//go:build linux

package sdnotify

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// passAt puts duplicates of files at consecutive free descriptor numbers, as systemd puts
// its sockets from 3 on, and returns the first; whatever is left open is closed when the test
// ends.
func passAt(t *testing.T, files ...*os.File) int {
	t.Helper()
	first := 512
	for !free(first, len(files)) {
		first += len(files)
	}
	for i, f := range files {
		if err := syscall.Dup3(int(f.Fd()), first+i, syscall.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { closeFDs(first, len(files)) })
	return first
}

func free(first, n int) bool {
	for fd := first; fd < first+n; fd++ {
		if _, err := fcntlGetFD(fd); !errors.Is(err, syscall.EBADF) {
			return false
		}
	}
	return true
}

func fcntlGetFD(fd int) (int, error) {
	r, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_GETFD, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(r), nil
}

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

type socketFile interface {
	File() (*os.File, error)
}

func fileOf(t *testing.T, s socketFile) *os.File {
	t.Helper()
	f, err := s.File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func listen(t *testing.T, network, addr string) net.Listener {
	t.Helper()
	l, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func TestListeners(t *testing.T) {
	tcp := listen(t, "tcp", "127.0.0.1:0")
	unix := listen(t, "unix", filepath.Join(t.TempDir(), "moxi.sock"))
	first := passAt(t, fileOf(t, tcp.(socketFile)), fileOf(t, unix.(socketFile)))
	pid := os.Getpid()

	ls, err := listeners(env("LISTEN_PID", strconv.Itoa(pid), "LISTEN_FDS", "2", "LISTEN_FDNAMES", "data:local"), pid, first)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	if len(ls) != 2 || ls[0].Addr().String() != tcp.Addr().String() || ls[1].Addr().String() != unix.Addr().String() {
		t.Fatalf("got %v, want the sockets on %s and %s", ls, tcp.Addr(), unix.Addr())
	}
	// The passed descriptors are closed: only the listeners' close-on-exec duplicates remain.
	if !free(first, 2) {
		t.Error("passed descriptors left open")
	}
	// The listener serves: a client's connection arrives on it.
	c, err := net.Dial("tcp", ls[0].Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := ls[0].Accept()
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}

func TestListenersNotOurs(t *testing.T) {
	pid := os.Getpid()
	for _, tc := range []struct {
		name   string
		getenv func(string) string
	}{
		{"no socket activation", env()},
		{"another process's sockets", env("LISTEN_PID", strconv.Itoa(pid+1), "LISTEN_FDS", "2")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ls, err := Listeners(tc.getenv, pid)
			if ls != nil || err != nil {
				t.Fatalf("got %v, %v; want none", ls, err)
			}
		})
	}
}

func TestListenersErrors(t *testing.T) {
	pid := strconv.Itoa(os.Getpid())
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	server := listen(t, "tcp", "127.0.0.1:0")
	client, err := net.Dial("tcp", server.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	for _, tc := range []struct {
		name  string
		env   []string
		files []*os.File
		want  string
	}{
		{"bad LISTEN_PID", []string{"LISTEN_PID", "me", "LISTEN_FDS", "1"}, nil, "LISTEN_PID"},
		{"bad LISTEN_FDS", []string{"LISTEN_PID", pid, "LISTEN_FDS", "two"}, nil, "LISTEN_FDS"},
		{"names for another count", []string{"LISTEN_PID", pid, "LISTEN_FDS", "1", "LISTEN_FDNAMES", "a:b"}, []*os.File{fileOf(t, server.(socketFile))}, "LISTEN_FDNAMES"},
		{"a pipe", []string{"LISTEN_PID", pid, "LISTEN_FDS", "1"}, []*os.File{r}, "socket operation on non-socket"},
		{"a connected socket", []string{"LISTEN_PID", pid, "LISTEN_FDS", "2"}, []*os.File{fileOf(t, server.(socketFile)), fileOf(t, client.(socketFile))}, "not a listening socket"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first := passAt(t, tc.files...)
			ls, err := listeners(env(tc.env...), os.Getpid(), first)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, %v; want an error saying %q", ls, err, tc.want)
			}
			if !free(first, len(tc.files)) {
				t.Error("passed descriptors left open")
			}
		})
	}
}

func TestMatch(t *testing.T) {
	loopback := listen(t, "tcp", "127.0.0.1:0")
	wildcard := listen(t, "tcp", ":0")
	path := filepath.Join(t.TempDir(), "moxi.sock")
	unix := listen(t, "unix", path)
	port := func(l net.Listener) string { return strconv.Itoa(l.Addr().(*net.TCPAddr).Port) }
	lp, wp := port(loopback), port(wildcard)

	for _, tc := range []struct {
		name       string
		configured []string
		passed     []net.Listener
		want       map[string]net.Listener // nil: an error
		errSays    string
	}{
		{"by address", []string{"127.0.0.1:" + lp, "0.0.0.0:" + wp, path},
			[]net.Listener{unix, loopback, wildcard},
			map[string]net.Listener{"127.0.0.1:" + lp: loopback, "0.0.0.0:" + wp: wildcard, path: unix}, ""},
		{"localhost and an empty host", []string{"localhost:" + lp, ":" + wp},
			[]net.Listener{loopback, wildcard},
			map[string]net.Listener{"localhost:" + lp: loopback, ":" + wp: wildcard}, ""},
		{"configured but not passed", []string{"127.0.0.1:" + lp, "127.0.0.1:1", "/run/none.sock"},
			[]net.Listener{loopback},
			map[string]net.Listener{"127.0.0.1:" + lp: loopback}, ""},
		{"nothing passed", []string{"127.0.0.1:11211"}, nil, map[string]net.Listener{}, ""},
		{"passed but not configured", []string{"127.0.0.1:" + lp},
			[]net.Listener{loopback, unix}, nil, path},
		{"another port", []string{"127.0.0.1:" + wp}, []net.Listener{loopback}, nil, loopback.Addr().String()},
		{"another address", []string{"127.0.0.2:" + lp}, []net.Listener{loopback}, nil, "matches no configured address"},
		{"a wildcard is not a loopback", []string{"127.0.0.1:" + wp}, []net.Listener{wildcard}, nil, "matches no configured address"},
		{"passed twice", []string{path}, []net.Listener{unix, unix}, nil, "both match"},
		{"unresolvable", []string{"127.0.0.1:no-such-service"}, []net.Listener{loopback}, nil, "no-such-service"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Match(tc.configured, tc.passed)
			if tc.want == nil {
				if err == nil || !strings.Contains(err.Error(), tc.errSays) {
					t.Fatalf("got %v, %v; want an error naming %q", got, err, tc.errSays)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for addr, l := range tc.want {
				if got[addr] != l {
					t.Errorf("%s: got %v, want the socket on %s", addr, got[addr], l.Addr())
				}
			}
		})
	}
}
