package frontend_test

import (
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/auth"
	"github.com/moxi-proxy/moxi/internal/frontend"
)

// BenchmarkRequest is one get answered over loopback by the frontend and the request path
// over embedded shards: the path a client waiting for each answer takes. Its allocations
// are the server's (the client reuses its buffers).
func BenchmarkRequest(b *testing.B) {
	ts := startProxy(b)
	c := dial(b, ts.addr)
	c.send([]byte("set bench 0 0 5\r\nvalue\r\n"))
	c.expect("STORED\r\n")
	roundTrips(b, c, []byte("get bench\r\n"), []byte("VALUE bench 0 5\r\nvalue\r\nEND\r\n"))
}

// BenchmarkPipeline is 100 gets sent in one write and their answers read, and reports the
// write system calls the answers took.
func BenchmarkPipeline(b *testing.B) {
	const n = 100
	ts := startProxy(b)
	c := dial(b, ts.addr)
	var req, want []byte
	for i := range n {
		c.send(fmt.Appendf(nil, "set p%02d 0 0 5\r\nvalue\r\n", i))
		c.expect("STORED\r\n")
		req = fmt.Appendf(req, "get p%02d\r\n", i)
		want = fmt.Appendf(want, "VALUE p%02d 0 5\r\nvalue\r\nEND\r\n", i)
	}
	sc := ts.ln.conn(0)
	before := sc.writes.Load()
	roundTrips(b, c, req, want)
	b.ReportMetric(float64(sc.writes.Load()-before)/float64(b.N), "writes/op")
}

// BenchmarkAuth is what client authentication adds to a request once the client has logged
// in: BenchmarkRequest and BenchmarkPipeline's requests without auth, with auth, and with
// auth.namespaces (each key renamed into its namespace and back in the answer). Over
// embedded shards in one process a request costs far less than one to a memcached through a
// real moxi, so the ratios here overstate the share auth takes of moxi's CPU.
func BenchmarkAuth(b *testing.B) {
	users := auth.NewUsers(map[string]string{"alice": "secret"})
	for _, tc := range []struct {
		name string
		auth *frontend.Auth
	}{{"off", nil}, {"auth", &frontend.Auth{Users: users}}, {"namespaces", &frontend.Auth{Users: users, Namespaces: true}}} {
		setup := func(b *testing.B) *client {
			s := &frontend.Server{Handler: newProxy(b)}
			s.SetAuth(tc.auth)
			c := dial(b, startServer(b, s).addr)
			if tc.auth != nil {
				c.send([]byte("set auth 0 0 12\r\nalice secret\r\n"))
				c.expect("STORED\r\n")
			}
			return c
		}
		b.Run("request/"+tc.name, func(b *testing.B) {
			c := setup(b)
			c.send([]byte("set bench 0 0 5\r\nvalue\r\n"))
			c.expect("STORED\r\n")
			roundTrips(b, c, []byte("get bench\r\n"), []byte("VALUE bench 0 5\r\nvalue\r\nEND\r\n"))
		})
		b.Run("pipeline/"+tc.name, func(b *testing.B) {
			c := setup(b)
			var req, want []byte
			for i := range 100 {
				c.send(fmt.Appendf(nil, "set p%02d 0 0 5\r\nvalue\r\n", i))
				c.expect("STORED\r\n")
				req = fmt.Appendf(req, "get p%02d\r\n", i)
				want = fmt.Appendf(want, "VALUE p%02d 0 5\r\nvalue\r\nEND\r\n", i)
			}
			roundTrips(b, c, req, want)
		})
	}
}

// roundTrips sends req and reads want, b.N times.
func roundTrips(b *testing.B, c *client, req, want []byte) {
	buf := make([]byte, len(want))
	_ = c.nc.SetDeadline(time.Time{})
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.nc.Write(req); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c.r, buf); err != nil || string(buf) != string(want) {
			b.Fatalf("%q %v", buf, err)
		}
	}
}

// BenchmarkPipelineSets is 100 sets of distinct keys sent in one write and their answers
// read: what a connection's runs of writes cost in the frontend and the request path (the
// fences of writes that may be retried among them).
func BenchmarkPipelineSets(b *testing.B) {
	const n = 100
	ts := startProxy(b)
	c := dial(b, ts.addr)
	var req, want []byte
	for i := range n {
		req = fmt.Appendf(req, "set p%02d 0 0 5\r\nvalue\r\n", i)
		want = append(want, "STORED\r\n"...)
	}
	roundTrips(b, c, req, want)
}
