package backend

import (
	"errors"
	"net"
	"os"
	"syscall"

	"github.com/moxi-proxy/moxi/internal/nbsys"
)

// plainSocket is nc's socket when nc is a plain one (not TLS, whose records are no
// answers): what readLoop waits on and conn.write writes first. Nil otherwise.
func plainSocket(nc net.Conn) syscall.RawConn {
	if _, isTLS := nc.(tlsState); isTLS {
		return nil
	}
	return nbsys.Socket(nc)
}

// socketWriter writes a plain server connection's socket what it takes at once (now), in
// one system call that does not wait. It is owned by the connection's writer (conn.writer).
type socketWriter struct {
	raw syscall.RawConn
	fn  func(fd uintptr) bool // write, made once: a closure per write would allocate
	buf []byte
	n   int
	err error
}

// newSocketWriter is nc's socketWriter; nil when nc is not a plain socket.
func newSocketWriter(nc net.Conn) *socketWriter {
	raw := plainSocket(nc)
	if raw == nil {
		return nil
	}
	w := &socketWriter{raw: raw}
	w.fn = w.write
	return w
}

// now writes what the socket takes of buf at once. A write deadline that has passed (the
// last slow write's) makes it write nothing, and conn.write the rest.
func (w *socketWriter) now(buf []byte) (int, error) {
	w.buf = buf
	err := w.raw.Write(w.fn)
	n, werr := w.n, w.err
	w.buf, w.n, w.err = nil, 0, nil
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return 0, nil
	case err != nil:
		return 0, err
	case errors.Is(werr, syscall.EAGAIN):
		return 0, nil
	}
	return max(n, 0), werr
}

func (w *socketWriter) write(fd uintptr) bool {
	w.n, w.err = nbsys.Write(fd, w.buf)
	for errors.Is(w.err, syscall.EINTR) {
		w.n, w.err = nbsys.Write(fd, w.buf)
	}
	return true // never wait for the socket: conn.write does, with its deadline
}
