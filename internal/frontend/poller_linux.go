package frontend

import (
	"errors"
	"os"
	"sync"
	"syscall"
	"time"
)

// poller wakes parked connections (park.go): an epoll instance watching each parked
// socket once (EPOLLONESHOT) for input or a hang-up. Go's own poller watches the epoll
// descriptor, so waiting for it holds no thread. Its table keeps the parked connections by
// value, in chunks of slotsPerChunk, with a free list.
type poller struct {
	s    *Server
	epfd int
	file *os.File // epfd, as Go's poller sees it

	mu     sync.Mutex
	chunks []*[slotsPerChunk]parked // a slot is empty when its nc is nil; guarded by mu
	free   []int32                  // empty slots; guarded by mu
	closed bool                     // guarded by mu
}

const slotsPerChunk = 256

// errUnsupported: connections do not park on this system.
var errUnsupported = errors.New("parking not supported")

func newPoller(s *Server) (*poller, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	if err := syscall.SetNonblock(epfd, true); err != nil {
		syscall.Close(epfd)
		return nil, os.NewSyscallError("setnonblock", err)
	}
	file := os.NewFile(uintptr(epfd), "epoll")
	if err := file.SetReadDeadline(time.Time{}); err != nil { // ErrNoDeadline: Go's poller does not watch it
		file.Close()
		return nil, err
	}
	return &poller{s: s, epfd: epfd, file: file}, nil
}

// park puts p in the table and watches its socket; false when the poller is closed (or the
// socket cannot be watched), and p is then the caller's still.
func (pl *poller) park(p *parked) bool {
	raw := descriptorOf(p.nc)
	if raw == nil {
		return false
	}
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if pl.closed {
		return false
	}
	if len(pl.free) == 0 {
		base := int32(len(pl.chunks) * slotsPerChunk)
		pl.chunks = append(pl.chunks, new([slotsPerChunk]parked))
		for i := int32(slotsPerChunk - 1); i >= 0; i-- {
			pl.free = append(pl.free, base+i)
		}
	}
	slot := pl.free[len(pl.free)-1]
	pl.free = pl.free[:len(pl.free)-1]
	at := pl.at(slot)
	gen := at.gen + 1
	*at = *p
	at.gen = gen
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT, Fd: slot, Pad: int32(gen)}
	var err error
	cerr := raw.Control(func(fd uintptr) {
		// Watched already when it parked before (a one-shot watch stays, disarmed).
		err = syscall.EpollCtl(pl.epfd, syscall.EPOLL_CTL_MOD, int(fd), &ev)
		if errors.Is(err, syscall.ENOENT) {
			err = syscall.EpollCtl(pl.epfd, syscall.EPOLL_CTL_ADD, int(fd), &ev)
		}
	})
	if err != nil || cerr != nil {
		pl.takeLocked(slot)
		return false
	}
	return true
}

// at is slot's place in the table. The caller holds mu.
func (pl *poller) at(slot int32) *parked { return &pl.chunks[slot/slotsPerChunk][slot%slotsPerChunk] }

// takeLocked empties slot and returns what it held. The caller holds mu.
func (pl *poller) takeLocked(slot int32) parked {
	at := pl.at(slot)
	p := *at
	*at = parked{gen: p.gen}
	pl.free = append(pl.free, slot)
	return p
}

// run serves the parked connections whose sockets became ready, until close.
func (pl *poller) run() {
	defer pl.s.workers.Done()
	raw, err := pl.file.SyscallConn()
	if err != nil {
		return
	}
	events := make([]syscall.EpollEvent, 128)
	_ = raw.Read(func(fd uintptr) bool {
		for {
			n, err := syscall.EpollWait(int(fd), events, 0)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if err != nil {
				return true
			}
			for i := range events[:n] {
				if p, ok := pl.ready(&events[i]); ok {
					go pl.s.wake(p)
				}
			}
			if n < len(events) {
				return false // drained: wait for the next event
			}
		}
	})
}

// ready takes the connection ev is for out of the table; false when it left already (woken
// by close or taken by takeIf, and its slot perhaps taken again).
func (pl *poller) ready(ev *syscall.EpollEvent) (parked, bool) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	slot := ev.Fd
	if slot < 0 || int(slot) >= len(pl.chunks)*slotsPerChunk {
		return parked{}, false
	}
	if at := pl.at(slot); at.nc == nil || at.gen != uint32(ev.Pad) {
		return parked{}, false
	}
	return pl.takeLocked(slot), true
}

// takeIf takes out of the table the parked connections for which drop is true.
func (pl *poller) takeIf(drop func(*parked) bool) []parked {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	var out []parked
	for slot := range int32(len(pl.chunks) * slotsPerChunk) {
		if at := pl.at(slot); at.nc != nil && drop(at) {
			out = append(out, pl.takeLocked(slot))
		}
	}
	return out
}

// count is the number of connections in the table that match.
func (pl *poller) count(match func(*parked) bool) int {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	n := 0
	for slot := range int32(len(pl.chunks) * slotsPerChunk) {
		if at := pl.at(slot); at.nc != nil && match(at) {
			n++
		}
	}
	return n
}

// parked is the number of connections in the table.
func (pl *poller) parked() int {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	return len(pl.chunks)*slotsPerChunk - len(pl.free)
}

// close stops the poller and returns every connection parked: none parks from now on.
func (pl *poller) close() []parked {
	pl.mu.Lock()
	pl.closed = true
	pl.mu.Unlock()
	out := pl.takeIf(func(*parked) bool { return true })
	_ = pl.file.Close() // run returns
	return out
}
