package admin

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestListenMakesRoom: at the cap a new connection replaces the longest idle one, else the
// oldest still sending its first request, and never one with a request in progress: then
// the new one is closed. A closed connection gives its slot back, once.
func TestListenMakesRoom(t *testing.T) {
	const shed = -1
	for _, tc := range []struct {
		name   string
		states []http.ConnState // of the connections holding the slots, in the order they were entered
		victim int              // the connection closed for the new one, or shed
	}{
		{"idle before new", []http.ConnState{http.StateNew, http.StateIdle, http.StateActive}, 1},
		{"longest idle", []http.ConnState{http.StateActive, http.StateIdle, http.StateIdle}, 1},
		{"oldest new", []http.ConnState{http.StateActive, http.StateNew, http.StateNew}, 1},
		{"all busy", []http.ConnState{http.StateActive, http.StateHijacked, http.StateActive}, shed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			l := Listen(ln, Bounds{MaxConns: len(tc.states)}).(*limitListener)
			accepted := make(chan net.Conn, 1)
			go func() { // ends when l is closed
				defer close(accepted)
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					accepted <- c
				}
			}()
			defer func() {
				l.Close()
				for c := range accepted {
					c.Close()
				}
			}()
			dial := func() net.Conn {
				c, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				return c
			}
			wantEOF := func(what string, c net.Conn) {
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
					t.Errorf("%s: read %v, want EOF (closed by the listener)", what, err)
				}
			}
			clients := make([]net.Conn, len(tc.states))
			servers := make([]net.Conn, len(tc.states))
			for i := range tc.states {
				clients[i] = dial()
				servers[i] = <-accepted
				defer servers[i].Close()
			}
			for i, s := range tc.states {
				trackState(servers[i], s)
			}

			newcomer := dial()
			if tc.victim == shed {
				wantEOF("the new connection", newcomer)
				if n := openConns(l); n != len(tc.states) {
					t.Errorf("%d connections open, want the %d busy ones", n, len(tc.states))
				}
				servers[0].Close()
				servers[0].Close() // the slot is given back once
				dial()
				(<-accepted).Close()
				return
			}
			(<-accepted).Close()
			wantEOF(fmt.Sprintf("connection %d (%s)", tc.victim, tc.states[tc.victim]), clients[tc.victim])
			l.mu.Lock()
			_, kept := l.conns[servers[tc.victim].(*trackedConn)]
			l.mu.Unlock()
			if kept {
				t.Errorf("connection %d closed but still holds a slot", tc.victim)
			}
		})
	}
}

// openConns is how many connections l holds.
func openConns(l *limitListener) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// TestProbesNotLockedOut: however many connections others hold on the admin port, kept
// alive and idle or stalled halfway through their headers, fresh probes of /healthz,
// /readyz and /metrics are answered, and the server holds at most MaxConns connections.
func TestProbesNotLockedOut(t *testing.T) {
	const holders, probes = 200, 30
	b := DefaultBounds
	b.ReadHeaderTimeout = time.Minute // the stalled headers must not time out during the test
	for _, tc := range []struct {
		name  string
		stall func(i int) bool // whether holder i stalls in its headers, else it idles
	}{
		{"idle keep-alive", func(int) bool { return false }},
		{"half-sent headers", func(int) bool { return true }},
		{"both", func(i int) bool { return i%2 == 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			l := Listen(ln, b).(*limitListener)
			srv := NewServer(topologyOf(t, map[string][]bool{"main": {true}}).handler(nil), b, nil)
			served := make(chan error, 1)
			go func() { served <- srv.Serve(l) }()
			defer func() {
				srv.Close()
				if err := <-served; !errors.Is(err, http.ErrServerClosed) {
					t.Error(err)
				}
			}()
			addr := ln.Addr().String()

			for i := range holders {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				if tc.stall(i) {
					if _, err := io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: moxi\r\nX-Half: "); err != nil {
						t.Fatal(err)
					}
					continue
				}
				io.WriteString(c, "GET /metrics HTTP/1.1\r\nHost: moxi\r\n\r\n")
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatalf("holder %d: %v", i, err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || resp.Close {
					t.Fatalf("holder %d: GET /metrics %d, close %v: want 200 kept alive", i, resp.StatusCode, resp.Close)
				}
			}
			held := openConns(l)

			client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
			for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
				answered := 0
				for range probes {
					resp, err := client.Get("http://" + addr + path)
					if err != nil {
						t.Logf("GET %s: %v", path, err)
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode == 200 {
						answered++
					}
				}
				t.Logf("%d holders (%s), %d held by the server: %s answered %d/%d fresh probes", holders, tc.name, held, path, answered, probes)
				if answered != probes {
					t.Errorf("%s: %d/%d probes answered", path, answered, probes)
				}
			}
			if held > b.MaxConns {
				t.Errorf("the server held %d connections, over MaxConns %d", held, b.MaxConns)
			}
		})
	}
}
