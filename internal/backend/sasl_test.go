package backend

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// saslUsers are the users of the tests' memcached -S.
var saslUsers = map[string]string{"alice": "secret"}

// logBuffer collects a Server's log lines, which its goroutines write while the test reads.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// lines are the logged lines that contain msg.
func (l *logBuffer) lines(msg string) []string {
	var out []string
	for _, line := range strings.Split(l.String(), "\n") {
		if strings.Contains(line, msg) {
			out = append(out, line)
		}
	}
	return out
}

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// countingDial is Dial to addr, counting the connections made in n.
func countingDial(addr string, n *atomic.Int32) func(ctx context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		n.Add(1)
		return Dial(ctx, addr, 5*time.Second, nil)
	}
}

// TestSASLAuthenticated: with the right credentials every connection authenticates first,
// and requests of every kind are served: single, multi-get, batch, stats; when the server
// comes back after a restart, the prober's connection authenticates too.
func TestSASLAuthenticated(t *testing.T) {
	mc := memcachedtest.StartSASL(t, saslUsers)
	s := newServer(t, mc.Addr, Options{Connections: 2, Timeout: 5 * time.Second, RetryMin: 10 * time.Millisecond, RetryMax: 20 * time.Millisecond,
		SASL: SASL{User: "alice", Password: "secret"}})
	check := func(when string) {
		t.Helper()
		if r := do(t, s, &protocol.Request{Op: protocol.OpSet, Key: []byte("a"), Value: []byte("1")}); r.Status != protocol.StatusOK {
			t.Fatalf("%s: set: %+v", when, r)
		}
		resps := make([]protocol.Response, 2)
		if err := pool.Do(context.Background(), s, nil, &protocol.Request{Op: protocol.OpGet, Keys: keys("a", "nope")}, resps); err != nil ||
			string(resps[0].Value) != "1" || resps[1].Status != protocol.StatusNotFound {
			t.Fatalf("%s: get a nope: %v %+v", when, err, resps)
		}
		batch := []protocol.Request{{Op: protocol.OpSet, Key: []byte("b"), Value: []byte("2"), Quiet: true}, {Op: protocol.OpGet, Keys: keys("b")}}
		errs := make([]error, 2)
		pool.DoBatch(context.Background(), s, nil, batch, resps, errs)
		if errs[0] != nil || errs[1] != nil || string(resps[1].Value) != "2" {
			t.Fatalf("%s: batch: %v %+v", when, errs, resps)
		}
		if r := do(t, s, &protocol.Request{Op: protocol.OpStats}); r.Status != protocol.StatusOK || len(r.Stats) == 0 {
			t.Fatalf("%s: stats: %+v", when, r)
		}
		if info := s.Info(); info.State != "up" || info.Reason != "" {
			t.Fatalf("%s: %+v, want up", when, info)
		}
	}
	check("first")

	mc.Stop()
	waitFor(t, "server marked dead once memcached is gone", func() bool {
		_, _ = getKey(t, s, "a")
		return !s.Up()
	})
	mc.Restart(t)
	waitFor(t, "server probed back up", s.Up)
	check("after the restart")
}

// TestSASLRefused: a server that refuses moxi's connections is marked dead at once, with a
// reason that says so, on /servers (Info) and in one log line naming the user, never the
// password; its requests then fail at once, and its probes, refused too, log nothing more.
// A server that does not know SASL is no server the pool's sasl section describes. memcached
// -F's refusal of a flush has the status of a refusal, and is an answer.
func TestSASLRefused(t *testing.T) {
	tests := []struct {
		name   string
		noSASL bool // memcached without -S
		sasl   SASL
		reason string
	}{
		{"wrong password", false, SASL{User: "alice", Password: "not-the-password"}, "SASL authentication failed as user alice"},
		{"unknown user", false, SASL{User: "bob", Password: "not-the-password"}, "SASL authentication failed as user bob"},
		{"no credentials", false, SASL{}, "the server requires SASL authentication (pools.main.sasl is not set)"},
		{"server without SASL", true, SASL{User: "alice", Password: "not-the-password"}, "is it running with -S?"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var mc *memcachedtest.Server
			if tc.noSASL {
				mc = memcachedtest.Start(t)
			} else {
				mc = memcachedtest.StartSASL(t, saslUsers)
			}
			var logs logBuffer
			var dials atomic.Int32
			s := newServer(t, mc.Addr, Options{Connections: 2, Timeout: 5 * time.Second, RetryMin: 10 * time.Millisecond, RetryMax: 20 * time.Millisecond,
				SASL: tc.sasl, Pool: "main", Logger: logs.logger(), dial: countingDial(mc.Addr, &dials)})
			if r, err := getKey(t, s, "a"); err == nil {
				t.Fatalf("get through a refused connection answered %+v", r)
			}
			waitFor(t, "server marked dead", func() bool { return !s.Up() })
			if _, err := getKey(t, s, "a"); !errors.Is(err, ErrDead) {
				t.Errorf("get from the dead server: %v, want ErrDead at once", err)
			}
			waitFor(t, "a few probes", func() bool { return dials.Load() >= 5 })
			info := s.Info()
			if info.State != "dead" || !strings.Contains(info.Reason, tc.reason) {
				t.Errorf("Info: %+v, want dead with reason %q", info, tc.reason)
			}
			if dead := logs.lines("backend marked dead"); len(dead) != 1 || !strings.Contains(dead[0], tc.reason) || !strings.Contains(dead[0], mc.Addr) {
				t.Errorf("logged %q, want one line marking %s dead: %s", dead, mc.Addr, tc.reason)
			}
			if news := logs.lines("still dead"); len(news) != 0 {
				t.Errorf("probes refused as the server was marked dead logged %q", news)
			}
			if strings.Contains(logs.String(), "not-the-password") || strings.Contains(info.Reason, "not-the-password") {
				t.Errorf("the password is in the log or the reason:\n%s", logs.String())
			}
		})
	}

	t.Run("refused flush", func(t *testing.T) {
		mc := memcachedtest.Start(t, "-F")
		s := newServer(t, mc.Addr, Options{Timeout: 5 * time.Second})
		var r [1]protocol.Response
		if err := pool.Do(context.Background(), s, nil, &protocol.Request{Op: protocol.OpFlushAll}, r[:]); err != nil || r[0].Status == protocol.StatusOK {
			t.Errorf("flush_all refused by memcached -F: %v %+v, want its refusal as the answer", err, r[0])
		}
		if info := s.Info(); info.State != "up" {
			t.Errorf("after memcached -F refused a flush: %+v, want up", info)
		}
		do(t, s, &protocol.Request{Op: protocol.OpGet, Keys: keys("a")})
	})
}

// TestSASLTextAnsweredByMoxi: a server that requires SASL speaks only the binary protocol,
// so meta requests and cache_memlimit, which moxi sends in text, are answered by moxi with a
// client error, whichever way they come, without a connection; each gives its turn on once.
func TestSASLTextAnsweredByMoxi(t *testing.T) {
	mc := memcachedtest.StartSASL(t, saslUsers)
	var dials atomic.Int32
	s := newServer(t, mc.Addr, Options{Connections: 1, Timeout: 5 * time.Second, SASL: SASL{User: "alice", Password: "secret"}, dial: countingDial(mc.Addr, &dials)})
	waitFor(t, "the binary connection", func() bool { return s.Counters().ConnectionsUp == 1 })
	mg, ms := metaRequest(t, "mg foo v\r\n"), metaRequest(t, "ms foo 1\r\nx\r\n")
	get := protocol.Request{Op: protocol.OpGet, Keys: keys("foo")}
	const metaRefused = "meta commands are not available on this pool: its servers require SASL, which allows only the binary protocol"
	tests := []struct {
		name string
		reqs []protocol.Request
		run  func(order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error)
		want []string // each answer's Msg; "" for an ordinary answer
	}{
		{"Do", []protocol.Request{*mg}, func(order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error) {
			errs[0] = pool.Do(context.Background(), s, order, &reqs[0], resps)
		}, []string{metaRefused}},
		{"DoBatch", []protocol.Request{*ms, *mg}, func(order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error) {
			pool.DoBatch(context.Background(), s, order, reqs, resps, errs)
		}, []string{metaRefused, metaRefused}},
		{"DoBatch mixed", []protocol.Request{*mg, get}, func(order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error) {
			pool.DoBatch(context.Background(), s, order, reqs, resps, errs)
		}, []string{metaRefused, ""}},
		{"Start", []protocol.Request{*mg}, func(order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error) {
			answered := false
			s.Start(context.Background(), order, reqs, resps, errs, func() { answered = true })
			if !answered {
				t.Error("a meta request moxi answers itself was not answered before Start returned")
			}
		}, []string{metaRefused}},
		{"cache_memlimit", []protocol.Request{{Op: protocol.OpCacheMemlimit, Delta: 64}}, func(order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error) {
			errs[0] = pool.Do(context.Background(), s, order, &reqs[0], resps)
		}, []string{"cache_memlimit is not available on this pool: its servers require SASL, which allows only the binary protocol"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			chain := turn.NewChain(0)
			var order turn.Turn
			chain.Next(&order)
			order.Wait()
			resps := make([]protocol.Response, len(tc.reqs))
			errs := make([]error, len(tc.reqs))
			tc.run(&order, tc.reqs, resps, errs)
			if n := order.Dispatches(); n != 1 {
				t.Errorf("gave the turn on %d times, want once", n)
			}
			for i, want := range tc.want {
				switch {
				case errs[i] != nil:
					t.Errorf("request %d: %v", i, errs[i])
				case want != "" && (resps[i].Status != protocol.StatusInvalid || resps[i].Msg != want):
					t.Errorf("request %d: status %d %q, want a client error %q", i, resps[i].Status, resps[i].Msg, want)
				case want == "" && resps[i].Status != protocol.StatusNotFound:
					t.Errorf("request %d: %+v, want the server's miss", i, resps[i])
				}
			}
		})
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("%d connections made, want 1: the binary one", n)
	}
}
