//go:build linux

package main

import (
	"errors"
	"net"
	"runtime"
	"syscall"
)

// With -goroutines the floor does the same work (framing, and with -codecs decoding and
// encoding) without event loops: a goroutine reads each client, and one each backend
// connection, with blocking reads of net.Conn (the goroutine parks in Go's netpoller until
// its socket is readable, and the scheduler runs it again), and handles what it read under
// one lock, as a loop handles an event; writes are the loop's, system calls on the
// non-blocking socket. That is how moxi reads its sockets, and how any goroutine-per-
// connection proxy does: the figures are the floor of a proxy hop built that way, and the
// difference from the event loops' the price of the scheduler's wake-ups.
//
// The lock makes it one loop whatever the number of clients: a floor for one connection's
// latency (bench/pipeline.sh), not for many clients' throughput.

// serveGoroutines accepts clients on listen until the process ends.
func serveGoroutines(listen, addr string, withCodecs bool) {
	ln, err := net.Listen("tcp", listen)
	check(err)
	l := &loop{addr: addr, clients: map[int]*client{}, goroutines: true}
	if withCodecs {
		l.codecs = newCodecs()
	}
	for {
		nc, err := ln.Accept()
		check(err)
		go l.serveClient(nc)
	}
}

// fdOf is nc's socket, which stays nc's (and the netpoller's): the loop's writes use it.
func fdOf(nc net.Conn) int {
	rc, err := nc.(*net.TCPConn).SyscallConn()
	check(err)
	var fd int
	check(rc.Control(func(s uintptr) { fd = int(s) }))
	return fd
}

// serveClient reads nc until it closes, handling each read as the loop handles a client's
// readable event.
func (l *loop) serveClient(nc net.Conn) {
	defer nc.Close()
	c := &client{stream: stream{fd: fdOf(nc)}}
	l.mu.Lock()
	l.clients[c.fd] = c
	l.mu.Unlock()
	buf := make([]byte, 64<<10)
	for {
		n, err := nc.Read(buf)
		l.mu.Lock()
		if n > 0 && !c.dead {
			c.in = append(c.in, buf[:n]...)
			l.clientInput(c)
			l.flushDirty()
		}
		if err != nil && !c.dead {
			l.close(c)
		}
		dead := c.dead
		l.mu.Unlock()
		if dead {
			return
		}
	}
}

// dialGoroutine connects b's socket and starts the goroutine that reads its answers.
func (l *loop) dialGoroutine(b *backend) {
	nc, err := net.Dial("tcp", l.addr)
	check(err)
	b.fd = fdOf(nc)
	go l.serveBackend(b, nc)
}

// serveBackend reads memcached's answers on nc, handling each read as the loop handles
// the backend's readable event.
func (l *loop) serveBackend(b *backend, nc net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		n, err := nc.Read(buf)
		if err != nil {
			check(errors.New("memcached closed the connection"))
		}
		l.mu.Lock()
		b.in = append(b.in, buf[:n]...)
		l.backendInput(b)
		l.flushDirty()
		l.mu.Unlock()
	}
}

// writeAll writes s.out whole: with no loop to wait for EPOLLOUT, a full socket is tried
// again after the other goroutines ran (a bench client reads its answers).
func writeAll(s *stream) {
	for len(s.out) > 0 {
		n, err := syscall.Write(s.fd, s.out)
		if n > 0 {
			s.out = s.out[n:]
		}
		switch {
		case err == syscall.EAGAIN:
			runtime.Gosched()
		case err != nil:
			s.dead = true
			s.out = s.out[:0]
		}
	}
	s.out = s.out[:0:cap(s.out)]
}
