package sdnotify

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// listenFDsStart is SD_LISTEN_FDS_START: systemd passes sockets from descriptor 3 on.
const listenFDsStart = 3

// The environment of socket activation.
const (
	envPID     = "LISTEN_PID"
	envFDs     = "LISTEN_FDS"
	envFDNames = "LISTEN_FDNAMES"
)

// Listeners returns the listening sockets systemd passed this process (pid, its process id)
// by socket activation, read from getenv (os.Getenv in moxi). It returns none when
// LISTEN_PID is not set or names another process: the variables are inherited, and a
// process started by an upgrade must not take descriptors meant for its parent. The
// passed descriptors are closed whatever happens; the listeners hold close-on-exec
// duplicates, so no child inherits them. A passed descriptor that is not a listening
// stream socket fails the call.
//
// The caller gives each listener to the `listen` or `listeners` entry whose address it has
// (Match), and must fail the start when one matches none: a socket systemd listens on
// that moxi does not serve would take connections no one answers. It drops the variables
// from the environment it passes on with StripListenEnv.
func Listeners(getenv func(string) string, pid int) ([]net.Listener, error) {
	return listeners(getenv, pid, listenFDsStart)
}

// listeners is Listeners with the first descriptor given, so tests can pass real sockets.
func listeners(getenv func(string) string, pid, first int) ([]net.Listener, error) {
	v := getenv(envPID)
	if v == "" {
		return nil, nil
	}
	to, err := strconv.Atoi(v)
	if err != nil {
		return nil, fmt.Errorf("sdnotify: %s=%q: not a process id", envPID, v)
	}
	if to != pid {
		return nil, nil
	}
	n, err := strconv.Atoi(getenv(envFDs))
	if err != nil || n < 0 || n > 1<<16 {
		return nil, fmt.Errorf("sdnotify: %s=%q: not a number of descriptors", envFDs, getenv(envFDs))
	}
	names := make([]string, n)
	if v := getenv(envFDNames); v != "" {
		if names = strings.Split(v, ":"); len(names) != n {
			closeFDs(first, n)
			return nil, fmt.Errorf("sdnotify: %s names %d sockets, %s=%d", envFDNames, len(names), envFDs, n)
		}
	}
	var ls []net.Listener
	for i := range n {
		l, err := listener(first+i, names[i])
		if err != nil {
			for _, l := range ls {
				l.Close()
			}
			closeFDs(first+i+1, n-i-1)
			return nil, fmt.Errorf("sdnotify: passed socket %d (%q): %w", i, names[i], err)
		}
		ls = append(ls, l)
	}
	return ls, nil
}

// listener returns a listener over a duplicate of fd, and closes fd.
func listener(fd int, name string) (net.Listener, error) {
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	// net.FileListener would take a connected socket too, and fail only at Accept.
	accepting, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_ACCEPTCONN)
	if err != nil {
		return nil, fmt.Errorf("descriptor %d: %w", fd, err)
	}
	if accepting == 0 {
		return nil, fmt.Errorf("descriptor %d: not a listening socket", fd)
	}
	l, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("descriptor %d: %w", fd, err)
	}
	return l, nil
}

func closeFDs(first, n int) {
	for fd := first; fd < first+n; fd++ {
		syscall.Close(fd)
	}
}

// StripListenEnv returns environ without socket activation's variables, for the
// environment of a child.
func StripListenEnv(environ []string) []string {
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if name != envPID && name != envFDs && name != envFDNames {
			out = append(out, kv)
		}
	}
	return out
}

// Match gives each passed listener to the configured address it listens on, keyed by that
// address as configured. A configured address no listener has is left out (the caller
// listens on it itself). A passed listener that matches no configured address, or a
// configured address two passed listeners match, is an error naming it.
//
// Unix socket paths compare as absolute paths. TCP addresses compare after resolving the
// configured "host:port" (net.ResolveTCPAddr): ports must be equal; "localhost" matches any
// loopback address; an empty or unspecified host (":11211", "0.0.0.0:11211",
// "[::]:11211") matches a socket on every address of either family, as systemd's
// ListenStream=11211 binds [::] for both.
func Match(configured []string, passed []net.Listener) (map[string]net.Listener, error) {
	matched := make(map[string]net.Listener, len(passed))
	for _, l := range passed {
		addr, err := matchAddr(configured, l.Addr())
		if err != nil {
			return nil, fmt.Errorf("sdnotify: passed socket on %s: %w", l.Addr(), err)
		}
		if prev, ok := matched[addr]; ok {
			return nil, fmt.Errorf("sdnotify: passed sockets on %s and %s both match %q", prev.Addr(), l.Addr(), addr)
		}
		matched[addr] = l
	}
	return matched, nil
}

// matchAddr returns the configured address a is.
func matchAddr(configured []string, a net.Addr) (string, error) {
	for _, c := range configured {
		ok, err := sameAddr(c, a)
		if err != nil {
			return "", err
		}
		if ok {
			return c, nil
		}
	}
	return "", fmt.Errorf("matches no configured address (%s)", strings.Join(configured, ", "))
}

func sameAddr(configured string, a net.Addr) (bool, error) {
	unixPath := strings.HasPrefix(configured, "/") || strings.HasPrefix(configured, "@") || !strings.Contains(configured, ":")
	switch a := a.(type) {
	case *net.UnixAddr:
		if !unixPath {
			return false, nil
		}
		if strings.HasPrefix(configured, "@") {
			return configured == a.Name, nil
		}
		path, err := filepath.Abs(configured)
		if err != nil {
			return false, fmt.Errorf("address %q: %w", configured, err)
		}
		return path == filepath.Clean(a.Name), nil
	case *net.TCPAddr:
		if unixPath {
			return false, nil
		}
		host, _, err := net.SplitHostPort(configured)
		if err != nil {
			return false, fmt.Errorf("address %q: %w", configured, err)
		}
		want, err := net.ResolveTCPAddr("tcp", configured)
		if err != nil {
			return false, fmt.Errorf("address %q: %w", configured, err)
		}
		switch {
		case want.Port != a.Port:
			return false, nil
		case want.IP == nil || want.IP.IsUnspecified():
			return a.IP.IsUnspecified(), nil
		case strings.EqualFold(host, "localhost"):
			return a.IP.IsLoopback(), nil
		}
		return want.IP.Equal(a.IP), nil
	}
	return false, nil
}
