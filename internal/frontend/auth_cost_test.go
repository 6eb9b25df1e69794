package frontend

import (
	"testing"

	"github.com/moxi-proxy/moxi/internal/auth"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// BenchmarkAuthGuard is the whole of the work authentication adds to a request once its
// client has logged in: guard, and with namespaces the renaming of the request's key and
// the answer's key back (a get of one key, a hit). Its time, set against a request's CPU
// through moxi (cpu-µs/req in test/auth_bench_test.go), is auth's share of that CPU.
func BenchmarkAuthGuard(b *testing.B) {
	users := auth.NewUsers(map[string]string{"alice": "secret"})
	for _, tc := range []struct {
		name string
		auth *Auth
	}{{"auth", &Auth{Users: users}}, {"namespaces", &Auth{Users: users, Namespaces: true}}} {
		b.Run(tc.name, func(b *testing.B) {
			c := &conn{s: &Server{}}
			c.s.auth.Store(tc.auth)
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
