package frontend_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/auth"
	"github.com/moxi-proxy/moxi/internal/frontend"
	"github.com/moxi-proxy/moxi/internal/tlstest"
)

// servePlain serves s on ln as it is (a counting listener's connections hide their
// descriptors, and so never park), until the test ends.
func servePlain(t *testing.T, s *frontend.Server, ln net.Listener) {
	t.Helper()
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-served; !errors.Is(err, frontend.ErrServerClosed) {
			t.Errorf("Serve returned %v, want ErrServerClosed", err)
		}
	})
}

func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// binaryGet is a binary get of key, opaque opaque.
func binaryGet(key string, opaque uint32) []byte {
	h := make([]byte, 24)
	h[0], h[1] = 0x80, 0x00
	binary.BigEndian.PutUint16(h[2:], uint16(len(key)))
	binary.BigEndian.PutUint32(h[8:], uint32(len(key)))
	binary.BigEndian.PutUint32(h[12:], opaque)
	return append(h, key...)
}

// TestIdleConnectionsPark: idle connections, text and binary, park (their goroutines end),
// and each is served as before when it speaks again — a pipeline, in its protocol — parks
// again, is closed when its client hangs up while parked, and Shutdown closes the rest.
func TestIdleConnectionsPark(t *testing.T) {
	s := &frontend.Server{Handler: newProxy(t)}
	ln := listenLoopback(t)
	addr := ln.Addr().String()
	servePlain(t, s, ln)
	const text, bin = 40, 10
	var clients []*client
	for i := range text + bin {
		c := dial(t, addr)
		if i < text {
			c.send(fmt.Appendf(nil, "set k%d 0 0 2\r\nv%d\r\n", i, i%10))
			c.expect("STORED\r\n")
		} else {
			c.send(binaryGet("missing", uint32(i)))
			if got := c.read(24 + len("Not found")); got[0] != 0x81 || binary.BigEndian.Uint16(got[6:]) != 1 {
				t.Fatalf("binary get answered %x", got)
			}
		}
		clients = append(clients, c)
	}
	waitFor(t, "every connection parked", func() bool { return s.Parked() == text+bin })
	before := runtime.NumGoroutine()

	for round := range 3 {
		for i, c := range clients {
			if i < text {
				c.send(fmt.Appendf(nil, "get k%d\r\nset r%d 0 0 1\r\n%d\r\nget r%d\r\n", i, i, round, i))
				c.expect(fmt.Sprintf("VALUE k%d 0 2\r\nv%d\r\nEND\r\nSTORED\r\nVALUE r%d 0 1\r\n%d\r\nEND\r\n", i, i%10, i, round))
			} else {
				c.send(append(binaryGet("missing", 7), binaryGet("missing", 8)...))
				for _, opaque := range []uint32{7, 8} {
					got := c.read(24 + len("Not found"))
					if got[0] != 0x81 || binary.BigEndian.Uint32(got[12:]) != opaque {
						t.Fatalf("binary get answered %x", got)
					}
				}
			}
		}
		waitFor(t, "every connection parked again", func() bool { return s.Parked() == text+bin })
	}
	if now := runtime.NumGoroutine(); now > before+5 {
		t.Errorf("%d goroutines with every connection parked, %d before", now, before)
	}

	for _, c := range clients[:text/2] {
		c.nc.Close()
	}
	waitFor(t, "hung-up parked connections closed", func() bool {
		current, _ := s.Connections()
		return current == text/2+bin && s.Parked() == text/2+bin
	})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown with parked connections: %v", err)
	}
	for _, c := range clients[text/2:] {
		c.expectEOF()
	}
}

// TestParkedKeepsLogin: a parked connection is still logged in when it wakes, and is closed
// when its user leaves the users file while it is parked.
func TestParkedKeepsLogin(t *testing.T) {
	s := &frontend.Server{Handler: newProxy(t)}
	users := auth.NewUsers(map[string]string{"alice": "secret", "bob": "hunter2"})
	s.SetAuth(&frontend.Auth{Users: users})
	ln := listenLoopback(t)
	servePlain(t, s, ln)
	alice, bob := dial(t, ln.Addr().String()), dial(t, ln.Addr().String())
	alice.send([]byte("set auth 0 0 12\r\nalice secret\r\n"))
	alice.expect("STORED\r\n")
	bob.send([]byte("set auth 0 0 11\r\nbob hunter2\r\n"))
	bob.expect("STORED\r\n")
	waitFor(t, "both parked", func() bool { return s.Parked() == 2 })

	alice.send([]byte("set a 0 0 1\r\n1\r\nget a\r\n"))
	alice.expect("STORED\r\nVALUE a 0 1\r\n1\r\nEND\r\n")
	waitFor(t, "both parked again", func() bool { return s.Parked() == 2 })

	s.SetAuth(&frontend.Auth{Users: auth.NewUsers(map[string]string{"alice": "secret"})})
	bob.expectEOF()
	waitFor(t, "bob's connection gone", func() bool { current, _ := s.Connections(); return current == 1 })
	alice.send([]byte("get a\r\n"))
	alice.expect("VALUE a 0 1\r\n1\r\nEND\r\n")
}

// TestParkTLSAndUnix: TLS and Unix-socket connections park and wake like TCP ones; a TLS
// connection parks only once its handshake is over, however long it takes to begin.
func TestParkTLSAndUnix(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	pair := ca.Issue(t, dir, "127.0.0.1")
	tlsLn := tls.NewListener(listenLoopback(t), &tls.Config{Certificates: []tls.Certificate{pair.Certificate(t)}})
	unixLn, err := net.Listen("unix", filepath.Join(dir, "moxi.sock"))
	if err != nil {
		t.Fatal(err)
	}
	s := &frontend.Server{Handler: newProxy(t)}
	servePlain(t, s, tlsLn)
	servePlain(t, s, unixLn)

	// A client slow to start its handshake: it sends nothing while the others park.
	slow, err := net.Dial("tcp", tlsLn.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { slow.Close() })
	tc, err := tls.Dial("tcp", tlsLn.Addr().String(), &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	uc, err := net.Dial("unix", unixLn.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	var clients []*client
	for _, nc := range []net.Conn{tc, uc} {
		t.Cleanup(func() { nc.Close() })
		_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
		clients = append(clients, newClient(t, nc))
	}
	for i, c := range clients {
		c.send(fmt.Appendf(nil, "set t%d 0 0 1\r\n%d\r\n", i, i))
		c.expect("STORED\r\n")
	}
	waitFor(t, "both parked", func() bool { return s.Parked() == 2 })
	late := tls.Client(slow, &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"})
	_ = late.SetDeadline(time.Now().Add(20 * time.Second))
	if err := late.Handshake(); err != nil {
		t.Fatalf("a handshake begun after the others parked: %v", err)
	}
	clients = append(clients, newClient(t, late))
	clients[2].send([]byte("set t2 0 0 1\r\n2\r\n"))
	clients[2].expect("STORED\r\n")
	for range 2 {
		waitFor(t, "all parked", func() bool { return s.Parked() == len(clients) })
		for i, c := range clients {
			c.send(fmt.Appendf(nil, "get t%d\r\nget t%d\r\n", i, i))
			one := fmt.Sprintf("VALUE t%d 0 1\r\n%d\r\nEND\r\n", i, i)
			c.expect(one + one)
		}
	}
}

func newClient(t testing.TB, nc net.Conn) *client {
	return &client{t: t, nc: nc, r: bufio.NewReader(nc)}
}
