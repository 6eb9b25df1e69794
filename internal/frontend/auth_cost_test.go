package frontend

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moxi-proxy/moxi/internal/auth"
	"github.com/moxi-proxy/moxi/internal/auth/limit"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// TestAuthGuardAllocs: a logged-in client's request, counted and charged to its user's
// limits, costs no allocation.
func TestAuthGuardAllocs(t *testing.T) {
	s := &Server{}
	s.RegisterMetrics(prometheus.NewRegistry())
	users := auth.NewUsers(map[string]string{"alice": "secret"})
	s.SetAuth(&Auth{Users: users, Limits: limit.NewUsers(map[string]limit.Rates{"alice": {Requests: 1 << 40, Bytes: 1 << 50}})})
	c := &conn{s: s}
	c.login.Store(&login{user: "alice", namespace: []byte("alice:")})
	keys := make([][]byte, 2)
	k1, k2 := []byte("k1"), []byte("k2")
	allocs := testing.AllocsPerRun(1000, func() {
		keys[0], keys[1] = k1, k2
		c.req = protocol.Request{Op: protocol.OpGet, Keys: keys}
		if answered, err := c.guard(); answered || err != nil {
			t.Fatal(answered, err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations a request", allocs)
	}
}

// BenchmarkAuthGuard is the whole of the work authentication adds to a request once its
// client has logged in: guard, and with namespaces the renaming of the request's key and
// the answer's key back (a get of one key, a hit). Its time, set against a request's CPU
// through moxi (cpu-µs/req in test/auth_bench_test.go), is auth's share of that CPU.
func BenchmarkAuthGuard(b *testing.B) {
	users := auth.NewUsers(map[string]string{"alice": "secret"})
	for _, tc := range []struct {
		name string
		auth *Auth
	}{
		{"auth", &Auth{Users: users}},
		{"namespaces", &Auth{Users: users, Namespaces: true}},
		// alice's requests a second taken from her bucket, far from empty.
		{"limits", &Auth{Users: users, Limits: limit.NewUsers(map[string]limit.Rates{"alice": {Requests: 1 << 40, Bytes: 1 << 50}})}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			c := &conn{s: &Server{}}
			c.s.SetAuth(tc.auth)
			c.login.Store(&login{user: "alice", namespace: []byte("alice:")})
			key := []byte("user:12345:profile")
			keys := make([][]byte, 1)
			resp := []protocol.Response{{Value: []byte("value")}}
			var out []byte
			b.ReportAllocs()
			for b.Loop() {
				keys[0] = key
				c.req = protocol.Request{Op: protocol.OpGet, Keys: keys}
				if answered, err := c.guard(); answered || err != nil {
					b.Fatal(answered, err)
				}
				out = protocol.AppendTextResponse(out[:0], &c.req, resp)
			}
		})
	}
}
