package frontend_test

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moxi-proxy/moxi/internal/auth"
	"github.com/moxi-proxy/moxi/internal/auth/limit"
	"github.com/moxi-proxy/moxi/internal/frontend"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// keyRecorder is a Handler that records the keys of the requests that reach it.
type keyRecorder struct {
	frontend.Handler
	mu   sync.Mutex
	keys []string // guarded by mu
}

func (h *keyRecorder) Handle(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response) []protocol.Response {
	h.mu.Lock()
	for i := range reqs {
		if reqs[i].Key != nil {
			h.keys = append(h.keys, string(reqs[i].Key))
		}
		for _, k := range reqs[i].Keys {
			h.keys = append(h.keys, string(k))
		}
	}
	h.mu.Unlock()
	return h.Handler.Handle(ctx, order, reqs, resps)
}

func (h *keyRecorder) reached() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.keys...)
}

// limited serves the two-shard proxy to alice, limited to rates, and bob, not limited,
// counting into reg.
func limited(t *testing.T, rates limit.Rates) (*testServer, *keyRecorder, *prometheus.Registry) {
	t.Helper()
	h := &keyRecorder{Handler: newProxy(t)}
	s := &frontend.Server{Handler: h}
	reg := prometheus.NewRegistry()
	s.RegisterMetrics(reg)
	s.SetAuth(&frontend.Auth{
		Users:  auth.NewUsers(map[string]string{"alice": "secret", "bob": "hunter2"}),
		Limits: limit.NewUsers(map[string]limit.Rates{"alice": rates}),
	})
	return startServer(t, s), h, reg
}

// userCount is the value of the series of the counter family name for user.
func userCount(t *testing.T, reg *prometheus.Registry, name, user string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if m.GetLabel()[0].GetValue() == user {
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1
}

func textLogin(c *client, user, password string) {
	c.t.Helper()
	data := user + " " + password
	c.send([]byte("set auth 0 0 " + strconv.Itoa(len(data)) + "\r\n" + data + "\r\n"))
	c.expect("STORED\r\n")
}

// TestLimitRequests: over her requests a second, alice's requests are answered
// SERVER_ERROR rate limited and reach no server; a multi-key get takes a token per key,
// all or none; a noreply request over the limit is dropped without an answer; each is
// counted, under her name; bob, not named, is served and counted as "*". The rate, 3 a
// second, refills a token in 333 ms: the exchanges below take a few.
func TestLimitRequests(t *testing.T) {
	ts, h, reg := limited(t, limit.Rates{Requests: 3})
	alice, bob := dial(t, ts.addr), dial(t, ts.addr)
	textLogin(alice, "alice", "secret")
	textLogin(bob, "bob", "hunter2")

	alice.send([]byte("get a b\r\n")) // 2 of 3
	alice.expect("END\r\n")
	alice.send([]byte("get c d\r\n")) // 2 more: refused whole
	alice.expect("SERVER_ERROR rate limited\r\n")
	alice.send([]byte("get e\r\n")) // the last
	alice.expect("END\r\n")
	alice.send([]byte("set x 0 0 1 noreply\r\nx\r\nget f\r\n")) // the set dropped, unanswered
	alice.expect("SERVER_ERROR rate limited\r\n")
	for range 5 {
		bob.send([]byte("get b1 b2 b3 b4\r\n"))
		bob.expect("END\r\n")
	}
	want := []string{"a", "b", "e"}
	for range 5 {
		want = append(want, "b1", "b2", "b3", "b4")
	}
	if got := h.reached(); !slices.Equal(got, want) {
		t.Errorf("keys that reached the servers: %q, want %q", got, want)
	}
	for _, tt := range []struct {
		name, user string
		want       float64
	}{
		{"moxi_user_requests_total", "alice", 7},
		{"moxi_rate_limited_total", "alice", 4},
		{"moxi_user_requests_total", "*", 20},
		{"moxi_rate_limited_total", "*", 0},
	} {
		if got := userCount(t, reg, tt.name, tt.user); got != tt.want {
			t.Errorf("%s{user=%q} = %v, want %v", tt.name, tt.user, got, tt.want)
		}
	}
}

// TestLimitProtocols: a meta request over the limit gets the SERVER_ERROR line, q or not;
// a binary one status 0x0086; a binary quiet one nothing: a getkq is then a miss, the noop
// after it answered.
func TestLimitProtocols(t *testing.T) {
	ts, h, _ := limited(t, limit.Rates{Requests: 1})
	meta := dial(t, ts.addr)
	textLogin(meta, "alice", "secret")
	meta.send([]byte("mg k v\r\nmg k v q\r\nmn\r\n"))
	meta.expect("EN\r\nSERVER_ERROR rate limited\r\nMN\r\n")

	ts, h, _ = limited(t, limit.Rates{Requests: 1})
	bin := dial(t, ts.addr)
	mechs := binRequest(0x21, 0, nil, []byte("PLAIN"), []byte("\x00alice\x00secret"))
	bin.send(mechs)
	if a := bin.readBinary(); a.Status != 0 {
		t.Fatalf("SASL auth: status %#x", a.Status)
	}
	const opGetKQ = 0x0d
	bin.send(binRequest(opGet, 1, nil, []byte("k1"), nil))
	if a := bin.readBinary(); a.Status != 0x0001 || a.Opaque != 1 {
		t.Fatalf("the first get: %+v, want a miss", a)
	}
	bin.send(append(append(binRequest(opGetKQ, 2, nil, []byte("k2"), nil), binRequest(opGet, 3, nil, []byte("k3"), nil)...), binRequest(opNoop, 4, nil, nil, nil)...))
	if a := bin.readBinary(); a.Status != 0x0086 || a.Opaque != 3 || a.Value != "rate limited" {
		t.Errorf("a get over the limit: %+v, want status 0x0086 and opaque 3", a)
	}
	if a := bin.readBinary(); a.Opcode != opNoop || a.Opaque != 4 {
		t.Errorf("after it: %+v, want the noop's answer (the getkq dropped)", a)
	}
	if got := h.reached(); len(got) != 1 || got[0] != "k1" {
		t.Errorf("keys that reached the servers: %q, want [k1]", got)
	}
}

// TestLimitBytes: a request's keys and value are taken before it is sent on, and an
// answer's after it is sent, as a debt that holds the next requests back.
func TestLimitBytes(t *testing.T) {
	ts, h, _ := limited(t, limit.Rates{Bytes: 100})
	alice := dial(t, ts.addr)
	textLogin(alice, "alice", "secret")
	big := string(make([]byte, 150))
	alice.send([]byte("set k 0 0 150\r\n" + big + "\r\n")) // more than a second's worth: a full bucket lets it through
	alice.expect("STORED\r\n")
	alice.send([]byte("get k\r\n"))
	alice.expect("SERVER_ERROR rate limited\r\n")
	if got := h.reached(); len(got) != 1 {
		t.Errorf("keys that reached the servers: %q, want [k]", got)
	}
}

// TestLimitReload: a reload that changes alice's limits applies to her open connection at
// its next request, without closing it.
func TestLimitReload(t *testing.T) {
	h := &keyRecorder{Handler: newProxy(t)}
	s := &frontend.Server{Handler: h}
	users := auth.NewUsers(map[string]string{"alice": "secret"})
	s.SetAuth(&frontend.Auth{Users: users, Limits: limit.NewUsers(map[string]limit.Rates{"alice": {Requests: 1}})})
	ts := startServer(t, s)
	alice := dial(t, ts.addr)
	textLogin(alice, "alice", "secret")
	alice.send([]byte("get a\r\nget b\r\n"))
	alice.expect("END\r\nSERVER_ERROR rate limited\r\n")
	s.SetAuth(&frontend.Auth{Users: users, Limits: limit.NewUsers(map[string]limit.Rates{"alice": {Requests: 1000}})})
	alice.send([]byte("get a\r\nget b\r\n"))
	alice.expect("END\r\nEND\r\n")
	s.SetAuth(&frontend.Auth{Users: users})
	for range 5 {
		alice.send([]byte("get c\r\n"))
		alice.expect("END\r\n")
	}
}
