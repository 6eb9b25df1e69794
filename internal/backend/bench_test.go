package backend

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

func benchServer(b *testing.B) *Server {
	b.Helper()
	mc := memcachedtest.Start(b)
	s := New(withDefaults(Options{Addr: mc.Addr, Timeout: 5 * time.Second}))
	b.Cleanup(func() { s.Close() })
	resps := make([]protocol.Response, 1)
	for i := range 100 {
		k := "bench:" + strconv.Itoa(i)
		req := protocol.Request{Op: protocol.OpSet, Key: []byte(k), Value: make([]byte, 100)}
		if err := pool.Do(context.Background(), s, nil, &req, resps); err != nil || resps[0].Status != protocol.StatusOK {
			b.Fatalf("set %s: %v %+v", k, err, resps[0])
		}
	}
	return s
}

// BenchmarkRoundTrip is one get of a 100-byte value: encode, write, memcached, read, match.
func BenchmarkRoundTrip(b *testing.B) {
	s := benchServer(b)
	req := protocol.Request{Op: protocol.OpGet, Keys: [][]byte{[]byte("bench:7")}}
	resps := make([]protocol.Response, 1)
	b.ReportAllocs()
	for b.Loop() {
		if err := pool.Do(context.Background(), s, nil, &req, resps); err != nil || resps[0].Status != protocol.StatusOK {
			b.Fatalf("%v %+v", err, resps[0])
		}
	}
}

// BenchmarkRoundTripParallel is many callers sharing the connections, where batching pays.
func BenchmarkRoundTripParallel(b *testing.B) {
	s := benchServer(b)
	b.ReportAllocs()
	b.SetParallelism(16)
	b.RunParallel(func(pb *testing.PB) {
		req := protocol.Request{Op: protocol.OpGet, Keys: [][]byte{[]byte("bench:7")}}
		resps := make([]protocol.Response, 1)
		for pb.Next() {
			if err := pool.Do(context.Background(), s, nil, &req, resps); err != nil || resps[0].Status != protocol.StatusOK {
				b.Errorf("%v %+v", err, resps[0])
				return
			}
		}
	})
	b.ReportMetric(float64(s.writes.Load())/float64(s.requests.Load()), "writes/req")
}

// BenchmarkMultiGet100 is a 100-key get: one batch of quiet gets and a noop.
func BenchmarkMultiGet100(b *testing.B) {
	s := benchServer(b)
	req := protocol.Request{Op: protocol.OpGet}
	for i := range 100 {
		req.Keys = append(req.Keys, []byte("bench:"+strconv.Itoa(i)))
	}
	resps := make([]protocol.Response, 100)
	b.ReportAllocs()
	for b.Loop() {
		if err := pool.Do(context.Background(), s, nil, &req, resps); err != nil || resps[99].Status != protocol.StatusOK {
			b.Fatalf("%v %+v", err, resps[99])
		}
	}
}
