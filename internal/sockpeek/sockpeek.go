// Package sockpeek tells whether bytes wait unread in a connection's receive buffer,
// without reading them or blocking.
package sockpeek

import (
	"net"
	"syscall"

	"github.com/moxi-proxy/moxi/internal/nbsys"
)

// Waiting reports whether nc has bytes received and not yet read. It costs a system call
// (recv with MSG_PEEK|MSG_DONTWAIT); false when nc is not a socket.
func Waiting(nc net.Conn) bool {
	rc := nbsys.Socket(nc)
	if rc == nil {
		return false
	}
	n := 0
	_ = rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, _ = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	})
	return n > 0
}
