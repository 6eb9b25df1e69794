package backend

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"syscall"
	"time"
)

// Dial opens a connection to the memcached server at addr (host:port) within timeout:
// TCP, and TLS over it when tlsConf is set, the handshake included in the timeout. An
// empty tlsConf.ServerName verifies the server's certificate for addr's host. It is the one
// way moxi reaches a server, so every connection to one is alike: a Server's pooled
// connections, its health probes and its meta connections (Server.dial, which then
// authenticates where the server requires SASL), and a migration's connections to the old
// server.
func Dial(ctx context.Context, addr string, timeout time.Duration, tlsConf *tls.Config) (net.Conn, error) {
	nd := &net.Dialer{Timeout: timeout}
	if tlsConf == nil {
		return nd.DialContext(ctx, "tcp", addr)
	}
	td := &tls.Dialer{NetDialer: nd, Config: tlsConf}
	nc, err := td.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return tlsConn{nc.(*tls.Conn)}, nil
}

// dial opens a connection to s (see Dial) within its connect timeout, authenticated when
// s requires SASL: every connection of a Server's, pooled, probing or other, is made here.
func (s *Server) dial(ctx context.Context) (net.Conn, error) {
	var nc net.Conn
	var err error
	if s.opts.dial != nil {
		nc, err = s.opts.dial(ctx)
	} else {
		nc, err = Dial(ctx, s.opts.Addr, s.opts.ConnectTimeout, s.opts.TLS)
	}
	if err != nil || !s.opts.SASL.set() {
		return nc, err
	}
	if err := s.authenticate(ctx, nc); err != nil {
		nc.Close()
		return nil, err
	}
	return nc, nil
}

// ownError reports whether err is moxi's own want of a resource (file descriptors,
// socket buffers, memory), which says nothing about the server it was dialing.
func ownError(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// tlsConn is a TLS connection to a server that behaves as the rest of the package expects
// of a connection.
//
// A write that times out is final: crypto/tls may have sent part of a record and fails
// every later write, so the error, still a timeout, is no longer os.ErrDeadlineExceeded,
// which conn.write goes on after as a TCP stream can. And the socket under the TLS layer
// is reachable, so that sockpeek sees the bytes that have arrived (conn.silence asks
// before a timeout).
type tlsConn struct {
	*tls.Conn
}

func (c tlsConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		err = tlsWriteTimeout{err}
	}
	return n, err
}

// tlsWriteTimeout is a TLS write that timed out: a net.Error timeout that does not
// unwrap to os.ErrDeadlineExceeded.
type tlsWriteTimeout struct{ err error }

func (e tlsWriteTimeout) Error() string {
	return "TLS write timed out, which ends the connection: " + e.err.Error()
}
func (tlsWriteTimeout) Timeout() bool   { return true }
func (tlsWriteTimeout) Temporary() bool { return false }

func (c tlsConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.NetConn().(syscall.Conn)
	if !ok {
		return nil, errors.New("no socket under the TLS connection")
	}
	return sc.SyscallConn()
}
