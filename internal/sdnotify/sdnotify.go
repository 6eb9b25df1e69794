// Package sdnotify is moxi's side of systemd's service protocol: the state notifications of
// sd_notify(3) and the listening sockets of socket activation, sd_listen_fds(3).
//
// Under systemd the unit is Type=notify: moxi sends Ready once it serves, Reloading and then
// Ready around a reload, Stopping when it stops. An upgrade hands the service to a new
// process; once the successor is ready, the old process (the main process, whose messages
// systemd always takes) sends MainPID(successor) and then exits. With NotifyAccess=all the
// successor may announce itself instead, with MainPID(os.Getpid()) + "\n" + Ready.
package sdnotify

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// States to send; several go in one message separated by "\n".
const (
	Ready     = "READY=1"
	Reloading = "RELOADING=1"
	Stopping  = "STOPPING=1"
)

// MainPID is the state that makes pid the service's main process.
func MainPID(pid int) string { return "MAINPID=" + strconv.Itoa(pid) }

// notifyTimeout bounds a notification: systemd reads its socket at once, so a send that
// waits is a service manager that is not listening, and moxi must not wait on it.
const notifyTimeout = time.Second

// Notify sends state to the service manager named by $NOTIFY_SOCKET; when it is not set (moxi
// is not run by systemd as Type=notify), Notify does nothing and returns nil.
func Notify(state string) error {
	return NotifyTo(os.Getenv("NOTIFY_SOCKET"), state)
}

// NotifyTo sends state to the datagram socket at socket: a path, or an abstract socket's
// name after "@". An empty socket is no service manager: NotifyTo does nothing.
func NotifyTo(socket, state string) error {
	if socket == "" {
		return nil
	}
	if !strings.HasPrefix(socket, "/") && !strings.HasPrefix(socket, "@") {
		return fmt.Errorf("sdnotify: NOTIFY_SOCKET=%q: not a path or an abstract socket", socket)
	}
	if state == "" {
		return errors.New("sdnotify: empty state")
	}
	// Go's net names an abstract Unix socket with a leading "@", as systemd does.
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: socket, Net: "unixgram"})
	if err != nil {
		return fmt.Errorf("sdnotify: %w", err)
	}
	defer conn.Close()
	conn.SetWriteDeadline(time.Now().Add(notifyTimeout))
	if _, err := conn.Write([]byte(state)); err != nil {
		return fmt.Errorf("sdnotify: send %q: %w", state, err)
	}
	return nil
}
