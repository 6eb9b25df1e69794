package handover

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Channel sends and receives messages, with their descriptors, over a Unix stream socket.
// One Send and one Recv may run at the same time; Sends (and Recvs) wait for each other.
// Close ends it; SetDeadline bounds whatever is running or comes next.
type Channel struct {
	conn *net.UnixConn

	sendMu sync.Mutex // held for the whole of a Send: a message's writes must not interleave with another's

	recvMu sync.Mutex // held for the whole of a Recv
	oob    []byte     // guarded by recvMu; room for one sendmsg's descriptors
}

// NewChannel returns a Channel over conn, which must be a Unix stream socket (net "unix").
// The Channel owns conn from then on.
func NewChannel(conn *net.UnixConn) *Channel {
	return &Channel{conn: conn, oob: make([]byte, syscall.CmsgSpace(MaxFDs*4))}
}

// FromFile returns a Channel over a duplicate of f's Unix stream socket; f stays the
// caller's to close.
func FromFile(f *os.File) (*Channel, error) {
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("handover: socket %s: %w", f.Name(), err)
	}
	uc, ok := c.(*net.UnixConn)
	// A datagram or seqpacket socket would cut messages at its own boundaries.
	if !ok || uc.LocalAddr().Network() != "unix" {
		c.Close()
		return nil, fmt.Errorf("handover: socket %s: not a Unix stream socket (%s)", f.Name(), c.LocalAddr().Network())
	}
	return NewChannel(uc), nil
}

// Pair makes the socket of a handover: the parent's Channel and the child's end as a file
// for exec.Cmd's ExtraFiles (its descriptor number in the child, 3 + its index there, goes
// in the child's environment as EnvFD). The parent closes childFile once the child has
// started. Both ends are close-on-exec, so no other child inherits them.
func Pair() (parent *Channel, childFile *os.File, err error) {
	// Made close-on-exec under ForkLock, as package os makes its descriptors: SOCK_CLOEXEC
	// is Linux's alone.
	syscall.ForkLock.RLock()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fds[0])
		syscall.CloseOnExec(fds[1])
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, nil, fmt.Errorf("handover: socketpair: %w", err)
	}
	parentFile := os.NewFile(uintptr(fds[0]), "handover")
	childFile = os.NewFile(uintptr(fds[1]), "handover")
	parent, err = FromFile(parentFile)
	parentFile.Close()
	if err != nil {
		childFile.Close()
		return nil, nil, err
	}
	return parent, childFile, nil
}

// FromEnv returns the Channel to the process that started this one, from the descriptor named
// by EnvFD; ok is false when EnvFD is not set (this process was not started by a
// handover). The inherited descriptor is closed (the Channel holds a close-on-exec
// duplicate), so this process's own children do not inherit it; EnvFD stays in the
// environment, and a later handover appends its own value, which exec.Cmd takes over the
// earlier one.
func FromEnv() (ch *Channel, ok bool, err error) {
	v := os.Getenv(EnvFD)
	if v == "" {
		return nil, false, nil
	}
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil, true, fmt.Errorf("handover: %s=%q: not a descriptor number", EnvFD, v)
	}
	f := os.NewFile(uintptr(fd), "handover")
	if f == nil {
		return nil, true, fmt.Errorf("handover: %s=%q: not a descriptor", EnvFD, v)
	}
	defer f.Close()
	ch, err = FromFile(f)
	return ch, true, err
}

// SetDeadline bounds Send and Recv: once t passes they fail with os.ErrDeadlineExceeded.
// A zero t removes the bound.
func (c *Channel) SetDeadline(t time.Time) error { return c.conn.SetDeadline(t) }

// Close closes the socket; a Send or Recv under way fails.
func (c *Channel) Close() error { return c.conn.Close() }

// Send writes m with files, which must be as many as m carries descriptors (one per
// Listener, one per ConnRecord, none otherwise). The files stay the caller's: the peer gets
// duplicates, and the caller must not close them during Send.
func (c *Channel) Send(m Message, files []*os.File) error {
	if len(files) != fds(m) {
		return fmt.Errorf("handover: send %T: %d descriptors for %d", m, len(files), fds(m))
	}
	b, err := AppendMessage(nil, m)
	if err != nil {
		return err
	}
	var oob []byte
	if len(files) > 0 {
		nums := make([]int, len(files))
		for i, f := range files {
			if nums[i], err = sysfd(f); err != nil {
				return fmt.Errorf("handover: send %T: descriptor %d: %w", m, i, err)
			}
		}
		oob = syscall.UnixRights(nums...)
	}
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	// The descriptors ride on the first bytes of the message: its header. One sendmsg may
	// take only part of a large message; the rest follows as plain writes.
	n, _, err := c.conn.WriteMsgUnix(b, oob, nil)
	runtime.KeepAlive(files)
	if err == nil && n < len(b) {
		_, err = c.conn.Write(b[n:])
	}
	if err != nil {
		return fmt.Errorf("handover: send %T: %w", m, err)
	}
	return nil
}

// sysfd returns f's descriptor without File.Fd, which would put it in blocking mode; the
// mode belongs to the open file, shared with the socket the old process still serves.
func sysfd(f *os.File) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, err
	}
	fd := -1
	if err := rc.Control(func(s uintptr) { fd = int(s) }); err != nil {
		return 0, err
	}
	return fd, nil
}

// Recv reads the next message and the descriptors it carries, as files the caller owns
// (close-on-exec). It allocates no more than the message type's bound, refusing a larger
// length from the header; on any error it closes whatever descriptors arrived. After an
// error the stream is out of step: close the Channel.
func (c *Channel) Recv() (Message, []*os.File, error) {
	c.recvMu.Lock()
	defer c.recvMu.Unlock()
	var files []*os.File
	m, err := c.recv(&files)
	if err == nil && len(files) != fds(m) {
		err = fmt.Errorf("%w: %T with %d descriptors", ErrMalformed, m, len(files))
	}
	if err != nil {
		closeAll(files)
		if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrVersion) && !errors.Is(err, ErrTooLarge) {
			err = fmt.Errorf("handover: recv: %w", err) // the codec's errors say they are the handover's
		}
		return nil, nil, err
	}
	return m, files, nil
}

func (c *Channel) recv(files *[]*os.File) (Message, error) {
	var header [headerLen]byte
	if err := c.readFull(header[:], files, true); err != nil {
		return nil, err
	}
	t, size, err := parseHeader(header[:])
	if err != nil {
		return nil, err
	}
	// Reading exactly this message's bytes, never into the next one's, is what ties the
	// descriptors that arrive to this message: the kernel hands them over with the first
	// bytes of the sendmsg that carried them.
	payload := make([]byte, size)
	if err := c.readFull(payload, files, false); err != nil {
		return nil, err
	}
	return parsePayload(t, payload)
}

// readFull fills b, appending the descriptors that arrive to files. first says b is the
// start of a message, where a closed socket is io.EOF rather than a truncated message.
func (c *Channel) readFull(b []byte, files *[]*os.File, first bool) error {
	for got := 0; got < len(b); {
		n, oobn, flags, _, err := c.conn.ReadMsgUnix(b[got:], c.oob)
		got += n
		if oobn > 0 {
			if err := takeRights(c.oob[:oobn], files); err != nil {
				return err
			}
		}
		if flags&syscall.MSG_CTRUNC != 0 {
			return fmt.Errorf("%w: more than %d descriptors at once", ErrMalformed, MaxFDs)
		}
		if len(*files) > MaxFDs {
			return fmt.Errorf("%w: more than %d descriptors", ErrMalformed, MaxFDs)
		}
		if err == nil && n == 0 {
			err = io.EOF
		}
		if err != nil {
			if errors.Is(err, io.EOF) && (got > 0 || !first) {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// takeRights appends the descriptors of the SCM_RIGHTS messages in oob to files.
func takeRights(oob []byte, files *[]*os.File) error {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return fmt.Errorf("control message: %w", err)
	}
	for i := range msgs {
		if msgs[i].Header.Level != syscall.SOL_SOCKET || msgs[i].Header.Type != syscall.SCM_RIGHTS {
			continue
		}
		nums, err := syscall.ParseUnixRights(&msgs[i])
		if err != nil {
			return fmt.Errorf("control message: %w", err)
		}
		for _, fd := range nums {
			*files = append(*files, os.NewFile(uintptr(fd), "handover"))
		}
	}
	return nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}
