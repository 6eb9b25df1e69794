package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/frontend"
	"github.com/moxi-proxy/moxi/internal/sdnotify"
)

// socketMode is the file mode of listen's Unix socket: moxi's user and group may connect.
const socketMode fs.FileMode = 0o660

// handshakeTimeout bounds a client's TLS handshake.
const handshakeTimeout = 10 * time.Second

// listen opens the client listener on addr: TCP, or a Unix socket when addr is a path
// (config.UnixSocket) — or takes passed, a socket for addr it was given (an upgrade's,
// systemd's). With serverTLS it serves TLS only, each handshake with the config
// serverTLS returns at that moment, so that the certificate a reload loaded is presented
// to the connections accepted after it, and those accepted before keep theirs.
func listen(addr string, passed net.Listener, serverTLS func() *tls.Config, logger *slog.Logger) (net.Listener, error) {
	ln := passed
	var err error
	switch {
	case ln != nil:
	case config.UnixSocket(addr):
		ln, err = listenUnix(addr)
	default:
		ln, err = net.Listen("tcp", addr)
	}
	if err != nil || serverTLS == nil {
		return ln, err
	}
	conf := &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return serverTLS(), nil }}
	return &tlsListener{Listener: ln, conf: conf, logger: logger}, nil
}

// listenError is the error of listening on addr for what (listen, admin) failing: an
// address in use says what probably holds it (hint) and which flag picks another.
func listenError(what, addr, hint string, err error) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%s %s: address already in use (%s)", what, addr, hint)
	}
	return fmt.Errorf("%s %s: %w", what, addr, err)
}

// listenUnix listens on a Unix socket at path, made with socketMode, after removing the
// socket a previous run left there. Go's listener removes the file again when closed.
func listenUnix(path string) (net.Listener, error) {
	if err := removeStale(path); err != nil {
		return nil, err
	}
	// The socket is created with the umask applied: set it so that the file is never, even
	// for a moment, open to others. The umask is the process's; nothing else creates files
	// while moxi starts.
	old := syscall.Umask(0o777 &^ int(socketMode))
	ln, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, socketMode); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// removeStale removes the socket at path that a moxi which did not exit cleanly left
// behind. Anything else there is an error: a file that is not a socket, or a socket that
// some process still accepts connections on.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%s exists and is not a socket (%s); not removing it", path, fi.Mode().Type())
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("%s: another process is listening on this socket", path)
	}
	return os.Remove(path)
}

// tlsListener makes each accepted connection a TLS server connection.
type tlsListener struct {
	net.Listener
	conf   *tls.Config
	logger *slog.Logger
}

func (l *tlsListener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &tlsConn{Conn: tls.Server(nc, l.conf), logger: l.logger}, nil
}

// tlsConn bounds the TLS handshake, which crypto/tls runs within the first Read or Write
// without a deadline of its own: otherwise a client that connects and sends nothing would
// hold its connection slot forever, and the frontend's accept loop too when it writes its
// refusal to a client over max_connections. A Write's handshake also ends by the write
// deadline, so that refusal stays as short as the frontend bounds it.
//
// It also reaches the socket under the TLS layer (SyscallConn), so that the frontend's
// sockpeek.Waiting sees a pipeline's bytes arriving as it does on a plain connection;
// bytes that crypto/tls has already read and decrypted it cannot see, which only means
// the answers read so far are sent before those requests are read.
// The frontend tells a TLS connection by this capability: it parks one only once its
// handshake is over (a wait cut short would fail the handshake), watching the socket under it.
var _ frontend.TLSConn = (*tlsConn)(nil)

type tlsConn struct {
	*tls.Conn
	logger  *slog.Logger
	done    atomic.Bool  // the handshake succeeded
	writeBy atomic.Int64 // the write deadline set, in Unix nanoseconds; 0: none
}

func (c *tlsConn) Read(p []byte) (int, error) {
	if err := c.handshake(time.Time{}); err != nil {
		return 0, err
	}
	return c.Conn.Read(p)
}

func (c *tlsConn) Write(p []byte) (int, error) {
	var by time.Time
	if ns := c.writeBy.Load(); ns != 0 {
		by = time.Unix(0, ns)
	}
	if err := c.handshake(by); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

func (c *tlsConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.NetConn().(syscall.Conn)
	if !ok {
		return nil, errors.New("no socket under the TLS connection")
	}
	return sc.SyscallConn()
}

func (c *tlsConn) SetDeadline(t time.Time) error {
	c.noteWriteDeadline(t)
	return c.Conn.SetDeadline(t)
}

func (c *tlsConn) SetWriteDeadline(t time.Time) error {
	c.noteWriteDeadline(t)
	return c.Conn.SetWriteDeadline(t)
}

func (c *tlsConn) noteWriteDeadline(t time.Time) {
	var ns int64
	if !t.IsZero() {
		ns = t.UnixNano()
	}
	c.writeBy.Store(ns)
}

// handshake completes the handshake, within handshakeTimeout and by by when it is set.
// A failed handshake closes the connection, and every later call returns its error.
func (c *tlsConn) handshake(by time.Time) error {
	if c.done.Load() {
		return nil
	}
	limit := time.Now().Add(handshakeTimeout)
	if !by.IsZero() && by.Before(limit) {
		limit = by
	}
	ctx, cancel := context.WithDeadline(context.Background(), limit)
	defer cancel()
	if err := c.HandshakeContext(ctx); err != nil {
		c.logger.Debug("client TLS handshake failed", "remote", c.RemoteAddr().String(), "err", err)
		return err
	}
	c.done.Store(true)
	return nil
}

// activated is the sockets systemd passed (socket activation, LISTEN_FDS) for cfg's listen
// and listeners addresses; nil when it passed none. A passed socket that matches none of
// them fails the start: it was meant for something this config does not serve.
func activated(cfg *config.Config) (*sockets, error) {
	passed, err := sdnotify.Listeners(os.Getenv, os.Getpid())
	if err != nil || len(passed) == 0 {
		return nil, err
	}
	addrs := []string{cfg.Listen}
	for _, l := range cfg.Listeners {
		addrs = append(addrs, l.Listen)
	}
	byAddr, err := sdnotify.Match(addrs, passed)
	if err != nil {
		for _, ln := range passed {
			ln.Close()
		}
		return nil, fmt.Errorf("socket activation: %w", err)
	}
	return &sockets{data: byAddr}, nil
}
