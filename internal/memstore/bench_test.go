package memstore

import (
	"context"
	"strconv"
	"testing"

	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

const benchKeys = 1024

func benchStore(b *testing.B) (*Store, [][]byte) {
	b.Helper()
	s := New(Options{})
	keys := make([][]byte, benchKeys)
	value := make([]byte, 100)
	for i := range keys {
		keys[i] = []byte("bench:key:" + strconv.Itoa(i))
		req := protocol.Request{Op: protocol.OpSet, Key: keys[i], Value: value}
		pool.Do(context.Background(), s, nil, &req, make([]protocol.Response, 1))
	}
	return s, keys
}

func BenchmarkGetHit(b *testing.B) {
	s, keys := benchStore(b)
	ctx := context.Background()
	req := protocol.Request{Op: protocol.OpGet, Keys: make([][]byte, 1)}
	resps := make([]protocol.Response, 1)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		req.Keys[0] = keys[i%benchKeys]
		pool.Do(ctx, s, nil, &req, resps)
	}
}

func BenchmarkSet(b *testing.B) {
	s, keys := benchStore(b)
	ctx := context.Background()
	req := protocol.Request{Op: protocol.OpSet, Value: make([]byte, 100)}
	resps := make([]protocol.Response, 1)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		req.Key = keys[i%benchKeys]
		pool.Do(ctx, s, nil, &req, resps)
	}
}

func BenchmarkGetHitParallel(b *testing.B) {
	s, keys := benchStore(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		req := protocol.Request{Op: protocol.OpGet, Keys: make([][]byte, 1)}
		resps := make([]protocol.Response, 1)
		for i := 0; pb.Next(); i++ {
			req.Keys[0] = keys[i%benchKeys]
			pool.Do(ctx, s, nil, &req, resps)
		}
	})
}

func BenchmarkSetParallel(b *testing.B) {
	s, keys := benchStore(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		req := protocol.Request{Op: protocol.OpSet, Value: make([]byte, 100)}
		resps := make([]protocol.Response, 1)
		for i := 0; pb.Next(); i++ {
			req.Key = keys[i%benchKeys]
			pool.Do(ctx, s, nil, &req, resps)
		}
	})
}

// BenchmarkSetNewKeys measures inserting keys the store has not seen, evicting as it fills.
func BenchmarkSetNewKeys(b *testing.B) {
	s := New(Options{MaxBytes: 1 << 20})
	ctx := context.Background()
	req := protocol.Request{Op: protocol.OpSet, Value: make([]byte, 100)}
	resps := make([]protocol.Response, 1)
	key := make([]byte, 0, 32)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		key = strconv.AppendInt(append(key[:0], "new:"...), int64(i), 10)
		req.Key = key
		pool.Do(ctx, s, nil, &req, resps)
	}
}
