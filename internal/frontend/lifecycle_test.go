package frontend_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/frontend"
	"github.com/moxi-proxy/moxi/internal/memstore"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/proxy"
	"github.com/moxi-proxy/moxi/internal/topology"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// gateHandler answers every request with version "gate", but only once the test releases
// it (or the request's context ends), so a test can hold a request in flight.
type gateHandler struct {
	entered  chan struct{} // one send per request that reached the handler
	release  chan struct{} // closed by the test
	canceled atomic.Bool   // a request's context ended before the release
}

func newGate() *gateHandler {
	return &gateHandler{entered: make(chan struct{}, 16), release: make(chan struct{})}
}

func (h *gateHandler) Handle(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response) []protocol.Response {
	for range reqs {
		h.entered <- struct{}{}
		select {
		case <-h.release:
		case <-ctx.Done():
			h.canceled.Store(true)
		}
		resps = append(resps, protocol.Response{Value: []byte("gate")})
	}
	return resps
}

// waitEntered waits until a request is inside the handler.
func (h *gateHandler) waitEntered(t *testing.T) {
	t.Helper()
	select {
	case <-h.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("no request reached the handler")
	}
}

func TestMaxConnections(t *testing.T) {
	ts := startServer(t, &frontend.Server{Handler: newProxy(t), MaxConnections: 2})
	c1, c2 := dial(t, ts.addr), dial(t, ts.addr)
	for _, c := range []*client{c1, c2} {
		c.send([]byte("version\r\n"))
		c.expect(versionAnswer)
	}

	refused := dial(t, ts.addr)
	refused.expect("SERVER_ERROR too many connections\r\n")
	refused.expectEOF()

	c1.nc.Close()
	waitFor(t, "the server to notice the close", func() bool { cur, _ := ts.Connections(); return cur == 1 })
	c3 := dial(t, ts.addr)
	c3.send([]byte("version\r\n"))
	c3.expect(versionAnswer)
	c2.send([]byte("version\r\n"))
	c2.expect(versionAnswer)
	if cur, total := ts.Connections(); cur != 2 || total != 3 {
		t.Errorf("Connections() = %d, %d; want 2 current, 3 served (the refused one is not counted)", cur, total)
	}
}

// TestConnections checks the counts, directly and as the proxy reports them in stats.
func TestConnections(t *testing.T) {
	s := &frontend.Server{}
	shard := memstore.New(memstore.Options{})
	p, err := pool.New("main", pool.Options{}, []pool.Member{{Name: "shard0", Addr: "embedded/0", Weight: 1, Server: shard}})
	if err != nil {
		t.Fatal(err)
	}
	s.Handler = proxy.New(&topology.Topology{Pools: []*pool.Pool{p}, Default: p}, proxy.Options{Release: testVersion, Connections: s.Connections})
	ts := startServer(t, s)

	stat := func(c *client, name string) string {
		t.Helper()
		c.send([]byte("stats\r\n"))
		for {
			line, err := c.r.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if line == "END\r\n" {
				t.Fatalf("stats has no %s", name)
			}
			if v, ok := strings.CutPrefix(line, "STAT "+name+" "); ok {
				for line != "END\r\n" && err == nil {
					line, err = c.r.ReadString('\n')
				}
				return strings.TrimSuffix(v, "\r\n")
			}
		}
	}

	var clients []*client
	for i := range 3 {
		c := dial(t, ts.addr)
		clients = append(clients, c)
		if got, want := stat(c, "curr_connections"), fmt.Sprint(i+1); got != want {
			t.Errorf("after %d dials: curr_connections %s, want %s", i+1, got, want)
		}
	}
	clients[0].nc.Close()
	clients[1].nc.Close()
	waitFor(t, "two closes", func() bool { cur, _ := ts.Connections(); return cur == 1 })
	if got := stat(clients[2], "curr_connections"); got != "1" {
		t.Errorf("curr_connections %s after two closes, want 1", got)
	}
	if got := stat(clients[2], "total_connections"); got != "3" {
		t.Errorf("total_connections %s, want 3", got)
	}
}

func TestShutdown(t *testing.T) {
	t.Run("idle connections close at once", func(t *testing.T) {
		ts := startProxy(t)
		served, silent := dial(t, ts.addr), dial(t, ts.addr)
		served.send([]byte("version\r\n"))
		served.expect(versionAnswer)
		waitFor(t, "both connections", func() bool { cur, _ := ts.Connections(); return cur == 2 })

		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := ts.Shutdown(ctx); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		served.expectEOF()
		silent.expectEOF()
		if cur, _ := ts.Connections(); cur != 0 {
			t.Errorf("%d connections after Shutdown", cur)
		}
	})

	t.Run("request in flight finishes", func(t *testing.T) {
		gate := newGate()
		ts := startServer(t, &frontend.Server{Handler: gate})
		busy, idle := dial(t, ts.addr), dial(t, ts.addr)
		busy.send([]byte("version\r\n"))
		gate.waitEntered(t)
		waitFor(t, "both connections", func() bool { cur, _ := ts.Connections(); return cur == 2 })

		shut := make(chan error, 1)
		go func() { shut <- ts.Shutdown(context.Background()) }()
		idle.expectEOF() // Shutdown has begun: the idle connection is gone ...
		select {
		case err := <-shut:
			t.Fatalf("Shutdown returned %v with a request in flight", err)
		default: // ... and the busy one is waited for
		}
		close(gate.release)
		busy.expect("VERSION gate\r\n")
		busy.expectEOF()
		if err := <-shut; err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		if gate.canceled.Load() {
			t.Error("the request's context was canceled by a Shutdown with time to spare")
		}
	})

	t.Run("expired context closes everything", func(t *testing.T) {
		gate := newGate()
		defer close(gate.release)
		ts := startServer(t, &frontend.Server{Handler: gate})
		busy := dial(t, ts.addr)
		busy.send([]byte("version\r\n"))
		gate.waitEntered(t)

		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		shut := make(chan error, 1)
		go func() { shut <- ts.Shutdown(ctx) }()
		select {
		case err := <-shut:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("Shutdown = %v, want context.Canceled", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Shutdown with an expired context is still waiting for the handler")
		}
		if !gate.canceled.Load() {
			t.Error("the handler's context was not canceled")
		}
		if cur, _ := ts.Connections(); cur != 0 {
			t.Errorf("%d connections after Shutdown", cur)
		}
		// The answer may or may not have made it out before the close; the connection must end.
		_ = busy.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 64)
		for {
			if _, err := busy.r.Read(buf); err != nil {
				if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
					t.Fatal("connection still open after Shutdown")
				}
				break
			}
		}
	})

	t.Run("serve after shutdown", func(t *testing.T) {
		ts := startProxy(t)
		if err := ts.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := <-ts.served; !errors.Is(err, frontend.ErrServerClosed) {
			t.Fatalf("Serve returned %v", err)
		}
		ts.served <- frontend.ErrServerClosed // for the cleanup's check
		ln := &countingListener{Listener: ts.ln.Listener}
		if err := ts.Serve(ln); !errors.Is(err, frontend.ErrServerClosed) {
			t.Fatalf("Serve after Shutdown = %v, want ErrServerClosed", err)
		}
	})
}

func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}
