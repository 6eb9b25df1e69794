//go:build linux

// Command floor is the reference the proxy benchmarks compare moxi with: a memcached
// forwarder with no features at all, built the cheapest way a proxy can be built on Linux,
// so that its figures are the floor of what a proxy hop costs on the machine at hand.
//
// Each of -loops event loops (one OS thread each, epoll, non-blocking sockets, no goroutine
// per connection) accepts clients on the same port (SO_REUSEPORT), appends every complete
// request to one backend connection per protocol, and hands the answers back in order.
// It only frames requests and answers: no key hashing, no parsing beyond the lengths, no
// timeouts, failover, metrics or bounds on memory. Each request must get exactly one
// answer: text storage commands, get/gets, delete, incr/decr, touch…, meta commands without
// the q flag (ms, mg, md, ma, mn), binary non-quiet commands (what memcaslap and a plain
// client send), binary quiet gets (getq, getkq, matched by opaque: spymemcached's
// multi-gets) and binary quiet writes (setq, deleteq… followed by a noop) as long as they
// succeed: a quiet write's answer is taken to be no answer. noreply and meta q are not
// supported.
//
// With -codecs it also does the work every request costs a proxy that speaks binary to
// memcached, as moxi does: decode, encode, and back (codecs.go). With -goroutines it reads
// its sockets as moxi does instead, a goroutine parked in Go's netpoller for each
// (goroutines.go): the floor of a proxy hop built on goroutines.
//
//	floor -listen 127.0.0.1:21600 -backend 127.0.0.1:11211 -loops 1
//	floor -listen 127.0.0.1:21601 -backend 127.0.0.1:11211 -loops 2 -codecs
//	floor -listen 127.0.0.1:21602 -backend 127.0.0.1:11211 -goroutines -codecs
package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"sync"
	"syscall"
)

const binaryHeader = 24

// stream is one side of a hop: a non-blocking socket and the bytes waiting to be written to
// it (out) or framed (in).
type stream struct {
	fd       int
	in, out  []byte
	writable bool // EPOLLOUT is armed: out did not fit in the socket
	dead     bool
}

type client struct {
	stream
	binary, sniffed bool
}

// backend is a loop's connection to memcached for one protocol: answers come back in the
// order the requests were appended, so waiting names whose they are.
type backend struct {
	stream
	binary  bool
	waiting []waiter
	pend    []*pending // -codecs: what the answers on their way are encoded from
}

// waiter is a client waiting for an answer from a backend: a quiet get (getq, getkq) is
// answered only when it hits, which its answer's opaque tells.
type waiter struct {
	c      *client
	quiet  bool
	opaque uint32
}

type loop struct {
	ep, ln  int
	addr    string
	be      [2]*backend // text, binary; dialed on first use
	clients map[int]*client
	dirty   []*stream // streams with output to flush once the events are handled
	codecs  *codecs   // -codecs (codecs.go); nil: frame only

	goroutines bool       // -goroutines (goroutines.go): no epoll, the loop's state under mu
	mu         sync.Mutex // held by the goroutine handling a read
}

func main() {
	listen := flag.String("listen", "127.0.0.1:21600", "`host:port` to accept clients on")
	addr := flag.String("backend", "127.0.0.1:11211", "memcached `host:port`")
	loops := flag.Int("loops", runtime.GOMAXPROCS(0), "event loops, one OS thread each")
	withCodecs := flag.Bool("codecs", false, "decode and encode each request and answer with moxi's codecs (codecs.go)")
	goroutines := flag.Bool("goroutines", false, "a goroutine reading each socket instead of event loops (goroutines.go); -loops is ignored")
	flag.Parse()
	if *goroutines {
		fmt.Fprintln(os.Stderr, "floor: listening on", *listen, "(goroutines)")
		serveGoroutines(*listen, *addr, *withCodecs)
		return
	}
	ap, err := netip.ParseAddrPort(*listen)
	check(err)
	for range *loops {
		ep, err := syscall.EpollCreate1(0)
		check(err)
		l := &loop{ep: ep, ln: listenFD(ap), addr: *addr, clients: map[int]*client{}}
		if *withCodecs {
			l.codecs = newCodecs()
		}
		l.ctl(syscall.EPOLL_CTL_ADD, l.ln, syscall.EPOLLIN)
		go l.run()
	}
	fmt.Fprintln(os.Stderr, "floor: listening on", *listen)
	select {}
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "floor:", err)
		os.Exit(1)
	}
}

func listenFD(ap netip.AddrPort) int {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK, 0)
	check(err)
	check(syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1))
	check(syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, 0xf /* SO_REUSEPORT */, 1))
	check(syscall.Bind(fd, &syscall.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}))
	check(syscall.Listen(fd, 1024))
	return fd
}

// dial connects to memcached with the standard library and keeps the socket's own
// descriptor, non-blocking, for the loop.
func dial(addr string) int {
	c, err := net.Dial("tcp", addr)
	check(err)
	f, err := c.(*net.TCPConn).File()
	check(err)
	fd, err := syscall.Dup(int(f.Fd()))
	check(err)
	c.Close()
	f.Close()
	check(syscall.SetNonblock(fd, true))
	return fd
}

func (l *loop) ctl(op, fd int, events uint32) {
	check(syscall.EpollCtl(l.ep, op, fd, &syscall.EpollEvent{Events: events, Fd: int32(fd)}))
}

func (l *loop) run() {
	runtime.LockOSThread()
	events := make([]syscall.EpollEvent, 256)
	buf := make([]byte, 64<<10)
	for {
		n, err := syscall.EpollWait(l.ep, events, -1)
		if err == syscall.EINTR {
			continue
		}
		check(err)
		for _, ev := range events[:n] {
			fd := int(ev.Fd)
			if fd == l.ln {
				l.accept()
				continue
			}
			if b := l.backendOf(fd); b != nil {
				if ev.Events&syscall.EPOLLOUT != 0 {
					l.flush(&b.stream)
				}
				if ev.Events&(syscall.EPOLLIN|syscall.EPOLLHUP|syscall.EPOLLERR) != 0 {
					if !readAll(&b.stream, buf) {
						check(errors.New("memcached closed the connection"))
					}
					l.backendInput(b)
				}
				continue
			}
			c := l.clients[fd]
			if c == nil {
				continue
			}
			if ev.Events&syscall.EPOLLOUT != 0 {
				l.flush(&c.stream)
			}
			if ev.Events&(syscall.EPOLLIN|syscall.EPOLLHUP|syscall.EPOLLERR) != 0 {
				if !readAll(&c.stream, buf) {
					l.close(c)
					continue
				}
				l.clientInput(c)
			}
		}
		l.flushDirty()
	}
}

// clientInput sends on the complete requests c's input holds.
func (l *loop) clientInput(c *client) {
	if l.codecs != nil {
		l.decodeRequests(c)
	} else {
		l.requests(c)
	}
}

// backendInput gives the complete answers b's input holds to their clients.
func (l *loop) backendInput(b *backend) {
	if l.codecs != nil {
		l.decodeAnswers(b)
	} else {
		l.answers(b)
	}
}

// flushDirty writes the output of the streams that have some, once the events are handled.
func (l *loop) flushDirty() {
	for _, s := range l.dirty {
		l.flush(s)
	}
	l.dirty = l.dirty[:0]
}

func (l *loop) accept() {
	for {
		fd, _, err := syscall.Accept4(l.ln, syscall.SOCK_NONBLOCK)
		if err != nil {
			return
		}
		_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
		l.clients[fd] = &client{stream: stream{fd: fd}}
		l.ctl(syscall.EPOLL_CTL_ADD, fd, syscall.EPOLLIN)
	}
}

func (l *loop) backendOf(fd int) *backend {
	for _, b := range l.be {
		if b != nil && b.fd == fd {
			return b
		}
	}
	return nil
}

// readAll appends what s's socket holds to s.in; false when the peer is gone.
func readAll(s *stream, buf []byte) bool {
	for {
		n, err := syscall.Read(s.fd, buf)
		if n > 0 {
			s.in = append(s.in, buf[:n]...)
		}
		switch {
		case err == syscall.EAGAIN:
			return true
		case err != nil || n == 0:
			return false
		case n < len(buf):
			return true
		}
	}
}

func (l *loop) close(c *client) {
	c.dead = true
	delete(l.clients, c.fd)
	if !l.goroutines { // else its net.Conn is closed by its goroutine
		_ = syscall.Close(c.fd)
	}
}

// requests moves c's complete requests to its protocol's backend connection.
func (l *loop) requests(c *client) {
	if !c.sniffed && len(c.in) > 0 {
		c.binary, c.sniffed = c.in[0] == 0x80, true
	}
	frame := textRequest
	if c.binary {
		frame = binaryFrame
	}
	b := l.backend(c.binary)
	for {
		n := frame(c.in)
		if n <= 0 {
			break
		}
		if len(b.out) == 0 {
			l.dirty = append(l.dirty, &b.stream)
		}
		b.out = append(b.out, c.in[:n]...)
		switch {
		case !c.binary:
			b.waiting = append(b.waiting, waiter{c: c})
		case quietGet(c.in[1]):
			b.waiting = append(b.waiting, waiter{c: c, quiet: true, opaque: binary.BigEndian.Uint32(c.in[12:16])})
		case !quietWrite(c.in[1]):
			b.waiting = append(b.waiting, waiter{c: c})
		}
		c.in = c.in[n:]
	}
	if len(c.in) == 0 {
		c.in = c.in[:0:cap(c.in)]
	}
}

func (l *loop) backend(bin bool) *backend {
	i := 0
	if bin {
		i = 1
	}
	if l.be[i] == nil && l.goroutines {
		l.be[i] = &backend{binary: bin}
		l.dialGoroutine(l.be[i])
	}
	if l.be[i] == nil {
		l.be[i] = &backend{stream: stream{fd: dial(l.addr)}, binary: bin}
		l.ctl(syscall.EPOLL_CTL_ADD, l.be[i].fd, syscall.EPOLLIN)
	}
	return l.be[i]
}

// answers gives b's complete answers to the clients waiting for them, in order.
func (l *loop) answers(b *backend) {
	frame := textAnswer
	if b.binary {
		frame = binaryFrame
	}
	for len(b.waiting) > 0 {
		n := frame(b.in)
		if n <= 0 {
			break
		}
		if b.binary { // quiet gets this answer is not for missed: memcached said nothing
			for op := binary.BigEndian.Uint32(b.in[12:16]); len(b.waiting) > 1 && b.waiting[0].quiet && b.waiting[0].opaque != op; {
				b.waiting = b.waiting[1:]
			}
		}
		c := b.waiting[0].c
		b.waiting = b.waiting[1:]
		if !c.dead {
			if len(c.out) == 0 {
				l.dirty = append(l.dirty, &c.stream)
			}
			c.out = append(c.out, b.in[:n]...)
		}
		b.in = b.in[n:]
	}
	if len(b.in) == 0 {
		b.in = b.in[:0:cap(b.in)]
	}
}

// flush writes s.out as far as the socket takes it, and waits for EPOLLOUT for the rest.
func (l *loop) flush(s *stream) {
	if s.dead {
		return
	}
	if l.goroutines {
		writeAll(s)
		return
	}
	for len(s.out) > 0 {
		n, err := syscall.Write(s.fd, s.out)
		if n > 0 {
			s.out = s.out[n:]
		}
		if err != nil {
			break
		}
	}
	if want := len(s.out) > 0; want != s.writable {
		s.writable = want
		events := uint32(syscall.EPOLLIN)
		if want {
			events |= syscall.EPOLLOUT
		}
		l.ctl(syscall.EPOLL_CTL_MOD, s.fd, events)
	}
	if len(s.out) == 0 {
		s.out = s.out[:0:cap(s.out)]
	}
}

// binaryFrame is the length of the binary packet at the start of b, or 0 while incomplete.
func binaryFrame(b []byte) int {
	if len(b) < binaryHeader {
		return 0
	}
	n := binaryHeader + int(binary.BigEndian.Uint32(b[8:12]))
	if len(b) < n {
		return 0
	}
	return n
}

// quietWrite reports whether a binary opcode is a quiet write: memcached answers it only
// when it fails.
func quietWrite(op byte) bool {
	switch op {
	case 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x18, 0x19, 0x1a: // setq addq replaceq deleteq incrq decrq flushq appendq prependq
		return true
	}
	return false
}

// quietGet reports whether a binary opcode is a quiet get: memcached answers it only on a hit.
func quietGet(op byte) bool { return op == 0x09 || op == 0x0d } // getq getkq

// textRequest is the length of the text request at the start of b (its data block
// included for a storage command or a meta set), or 0 while incomplete.
func textRequest(b []byte) int {
	i := bytes.Index(b, []byte("\r\n"))
	if i < 0 {
		return 0
	}
	n := i + 2
	f := bytes.Fields(b[:i])
	size := -1
	switch {
	case len(f) >= 5 && storage(string(f[0])):
		size = atoi(f[4])
	case len(f) >= 3 && string(f[0]) == "ms":
		size = atoi(f[2])
	}
	if size >= 0 {
		n += size + 2
		if len(b) < n {
			return 0
		}
	}
	return n
}

// atoi is a data block's length token, 0 when it is not a number.
func atoi(b []byte) int {
	n, err := strconv.Atoi(string(b))
	if err != nil || n < 0 {
		return 0
	}
	return n
}

func storage(cmd string) bool {
	switch cmd {
	case "set", "add", "replace", "append", "prepend", "cas":
		return true
	}
	return false
}

// textAnswer is the length of the text answer at the start of b: VALUE blocks up to the
// line that is not one (END, or a single-line answer), a meta VA line and its data, or 0
// while incomplete.
func textAnswer(b []byte) int {
	at := 0
	for {
		i := bytes.Index(b[at:], []byte("\r\n"))
		if i < 0 {
			return 0
		}
		line := b[at : at+i]
		if at == 0 && bytes.HasPrefix(line, []byte("VA ")) {
			f := bytes.Fields(line)
			if n := i + 2 + atoi(f[1]) + 2; n <= len(b) {
				return n
			}
			return 0
		}
		if !bytes.HasPrefix(line, []byte("VALUE ")) {
			return at + i + 2
		}
		f := bytes.Fields(line)
		if len(f) < 4 {
			return at + i + 2
		}
		at += i + 2 + atoi(f[3]) + 2
		if at > len(b) {
			return 0
		}
	}
}
