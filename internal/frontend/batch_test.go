package frontend_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/moxi-proxy/moxi/internal/frontend"
	"github.com/moxi-proxy/moxi/internal/memstore"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/proxy"
	"github.com/moxi-proxy/moxi/internal/topology"
)

// countingServer is an embedded store that counts the requests it is asked.
type countingServer struct {
	*memstore.Store
	calls atomic.Int64
}

func (s *countingServer) Do(ctx context.Context, req *protocol.Request, resps []protocol.Response) error {
	s.calls.Add(1)
	return s.Store.Do(ctx, req, resps)
}

// TestQuietGetsAnsweredAsOneBatch: 100 pipelined getkq and a noop (libmemcached's binary
// mget) reach the server as one request, and every client answer keeps its own opaque and
// key, in order, misses suppressed.
func TestQuietGetsAnsweredAsOneBatch(t *testing.T) {
	srv := &countingServer{Store: memstore.New(memstore.Options{})}
	p, err := pool.New("main", pool.Options{}, []pool.Member{{Name: "s", Addr: "embedded/0", Weight: 1, Server: srv}})
	if err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, &frontend.Server{Handler: proxy.New(&topology.Topology{Pools: []*pool.Pool{p}, Default: p}, proxy.Options{})})
	c := dial(t, ts.addr)

	var stream []byte
	for i := range 100 {
		if i%2 == 0 { // even keys exist
			key := []byte(fmt.Sprintf("k%d", i))
			ext := binary.BigEndian.AppendUint64(nil, 0)                                        // flags 0, exptime 0
			stream = append(stream, binRequest(0x11, uint32(1000+i), ext, key, []byte("v"))...) // setq
		}
	}
	stream = append(stream, binRequest(0x0a, 1, nil, nil, nil)...) // noop
	c.send(stream)
	c.read(24) // the noop's answer: the setqs were quiet

	stream = stream[:0]
	for i := range 100 {
		stream = append(stream, binRequest(0x0d, uint32(i), nil, []byte(fmt.Sprintf("k%d", i)), nil)...) // getkq
	}
	stream = append(stream, binRequest(0x0a, 7777, nil, nil, nil)...)
	// The first run teaches moxi the size of the values (until then it answers a large
	// multi-get in small parts, in case the values are large); the second is measured.
	for run := range 2 {
		before := srv.calls.Load()
		c.send(stream)
		readBatch(t, c)
		if n := srv.calls.Load() - before; run == 1 && n != 1 {
			t.Errorf("100 pipelined getkq cost %d server requests; want 1", n)
		}
	}
}

// readBatch reads the answers to the getkq run of TestQuietGetsAnsweredAsOneBatch.
func readBatch(t *testing.T, c *client) {
	t.Helper()
	for i := 0; i < 100; i += 2 {
		hdr := c.read(24)
		if hdr[1] != 0x0d || binary.BigEndian.Uint32(hdr[12:16]) != uint32(i) {
			t.Fatalf("answer for key %d: opcode %#x opaque %d", i, hdr[1], binary.BigEndian.Uint32(hdr[12:16]))
		}
		body := c.read(int(binary.BigEndian.Uint32(hdr[8:12])))
		key := body[hdr[4] : int(hdr[4])+int(binary.BigEndian.Uint16(hdr[2:4]))]
		if !bytes.Equal(key, []byte(fmt.Sprintf("k%d", i))) || !bytes.HasSuffix(body, []byte("v")) {
			t.Fatalf("answer for key %d: body %q", i, body)
		}
	}
	if hdr := c.read(24); hdr[1] != 0x0a || binary.BigEndian.Uint32(hdr[12:16]) != 7777 {
		t.Fatalf("after the hits: opcode %#x, want the noop", hdr[1])
	}
}
