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
	"github.com/moxi-proxy/moxi/internal/turn"
)

// countingServer is an embedded store that counts the requests it is asked: lone ones
// (calls) and runs (batches).
type countingServer struct {
	*memstore.Store
	calls   atomic.Int64
	batches atomic.Int64
}

func (s *countingServer) Start(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error, done func()) {
	if len(reqs) == 1 {
		s.calls.Add(1)
	} else {
		s.batches.Add(1)
	}
	s.Store.Start(ctx, order, reqs, resps, errs, done)
}

// startCounting serves a proxy over one countingServer.
func startCounting(t *testing.T) (*countingServer, *testServer) {
	t.Helper()
	srv := &countingServer{Store: memstore.New(memstore.Options{})}
	p, err := pool.New("main", pool.Options{}, []pool.Member{{Name: "s", Addr: "embedded/0", Weight: 1, Server: srv}})
	if err != nil {
		t.Fatal(err)
	}
	return srv, startServer(t, &frontend.Server{Handler: proxy.New(&topology.Topology{Pools: []*pool.Pool{p}, Default: p}, proxy.Options{})})
}

// TestQuietGetsAnsweredAsOneBatch: 100 pipelined getkq and a noop (libmemcached's binary
// mget) reach the server as one request, and every client answer keeps its own opaque and
// key, in order, misses suppressed.
func TestQuietGetsAnsweredAsOneBatch(t *testing.T) {
	srv, ts := startCounting(t)
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

// TestPipelinedWritesSentAsOneBatch: a pipeline of text writes (noreply or not) reaches the
// server as one batch, executed in order, each answered in its place; so do binary quiet
// writes, whose failures alone are answered.
func TestPipelinedWritesSentAsOneBatch(t *testing.T) {
	srv, ts := startCounting(t)

	t.Run("text", func(t *testing.T) {
		c := dial(t, ts.addr)
		var stream, want bytes.Buffer
		for i := range 100 {
			switch i % 4 {
			case 0, 1:
				fmt.Fprintf(&stream, "set k%d 0 0 2\r\nv%d\r\n", i/4, i%4)
				want.WriteString("STORED\r\n")
			case 2:
				fmt.Fprintf(&stream, "append k%d 0 0 1 noreply\r\n!\r\n", i/4)
			case 3:
				fmt.Fprintf(&stream, "add k%d 0 0 1\r\nx\r\n", i/4)
				want.WriteString("NOT_STORED\r\n")
			}
		}
		stream.WriteString("get k0 k24\r\n")
		want.WriteString("VALUE k0 0 3\r\nv1!\r\nVALUE k24 0 3\r\nv1!\r\nEND\r\n")
		before := srv.batches.Load()
		c.send(stream.Bytes())
		if got := c.read(want.Len()); !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("answers:\n%q\nwant\n%q", got, want.Bytes())
		}
		// One read of the pipeline makes one batch; the stream is small enough to arrive
		// whole, but TCP may still split it once.
		if n := srv.batches.Load() - before; n < 1 || n > 2 {
			t.Errorf("100 pipelined writes made %d batches; want 1 (2 if the stream was split)", n)
		}
	})
	t.Run("sets and gets", func(t *testing.T) {
		c := dial(t, ts.addr)
		var stream, want bytes.Buffer
		for i := range 50 {
			fmt.Fprintf(&stream, "set m%d 0 0 2\r\nv%d\r\nget m%d\r\ngets nothere%d\r\n", i, i%10, i, i)
			fmt.Fprintf(&want, "STORED\r\nVALUE m%d 0 2\r\nv%d\r\nEND\r\nEND\r\n", i, i%10)
		}
		before := srv.batches.Load()
		c.send(stream.Bytes())
		if got := c.read(want.Len()); !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("answers:\n%q\nwant\n%q", got, want.Bytes())
		}
		if n := srv.batches.Load() - before; n < 1 || n > 3 {
			t.Errorf("150 pipelined sets and gets made %d batches; want 2 (128 a run), 3 if the stream was split", n)
		}
	})
	t.Run("binary quiet", func(t *testing.T) {
		c := dial(t, ts.addr)
		ext := binary.BigEndian.AppendUint64(nil, 0) // flags 0, exptime 0
		var stream []byte
		for i := range 50 {
			stream = append(stream, binRequest(0x11, uint32(i), ext, []byte(fmt.Sprintf("b%d", i)), []byte("v"))...) // setq
		}
		stream = append(stream, binRequest(0x12, 999, ext, []byte("b7"), []byte("w"))...) // addq of an existing key
		stream = append(stream, binRequest(0x0a, 1000, nil, nil, nil)...)                 // noop
		c.send(stream)
		hdr := c.read(24)
		if hdr[1] != 0x12 || binary.BigEndian.Uint16(hdr[6:8]) != 0x0002 || binary.BigEndian.Uint32(hdr[12:16]) != 999 {
			t.Fatalf("first answer: opcode %#x status %#x opaque %d; want addq's key-exists, opaque 999",
				hdr[1], binary.BigEndian.Uint16(hdr[6:8]), binary.BigEndian.Uint32(hdr[12:16]))
		}
		c.read(int(binary.BigEndian.Uint32(hdr[8:12])))
		if hdr := c.read(24); hdr[1] != 0x0a || binary.BigEndian.Uint32(hdr[12:16]) != 1000 {
			t.Fatalf("then opcode %#x opaque %d; want the noop", hdr[1], binary.BigEndian.Uint32(hdr[12:16]))
		}
	})
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
