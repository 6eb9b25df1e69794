package frontend_test

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// TestSniff checks that the first byte of each connection picks its protocol, on one port.
func TestSniff(t *testing.T) {
	ts := startProxy(t)
	tests := []struct {
		name string
		run  func(c *client)
	}{
		{name: "text", run: func(c *client) {
			c.send([]byte("set t 5 0 2\r\nhi\r\nget t\r\nversion\r\n"))
			c.expect("STORED\r\nVALUE t 5 2\r\nhi\r\nEND\r\n" + versionAnswer)
		}},
		{name: "binary", run: func(c *client) {
			c.send(append(binSet(1, "b", "yo", 7), binRequest(opGetK, 2, nil, []byte("b"), nil)...))
			want := []binAnswer{
				{Opcode: opSet, Opaque: 1},
				{Opcode: opGetK, Opaque: 2, Ext: flagsExt(7), Key: "b", Value: "yo"},
			}
			for _, w := range want {
				got := c.readBinary()
				if got != w {
					t.Fatalf("got %+v, want %+v", got, w)
				}
			}
		}},
		{name: "text sees binary's key", run: func(c *client) {
			c.send([]byte("get b\r\n"))
			c.expect("VALUE b 7 2\r\nyo\r\nEND\r\n")
		}},
		{name: "binary sees text's key", run: func(c *client) {
			c.send(binRequest(opGet, 3, nil, []byte("t"), nil))
			if got, want := c.readBinary(), (binAnswer{Opcode: opGet, Opaque: 3, Ext: flagsExt(5), Value: "hi"}); got != want {
				t.Fatalf("got %+v, want %+v", got, want)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.run(dial(t, ts.addr)) })
	}
}

// TestPipelineInOrder sends 100 requests in one write and checks that the answers come back
// in request order.
func TestPipelineInOrder(t *testing.T) {
	ts := startProxy(t)
	t.Run("text mixed", func(t *testing.T) {
		var in, want strings.Builder
		for i := range 25 {
			v := strings.Repeat("v", i)
			fmt.Fprintf(&in, "set k%d %d 0 %d\r\n%s\r\n", i, i, len(v), v)
			fmt.Fprintf(&in, "get miss%d k%d miss%d\r\n", i, i, i)
			fmt.Fprintf(&in, "incr k%d 1\r\n", i+1000)
			fmt.Fprintf(&in, "delete k%d\r\n", i)
			fmt.Fprintf(&want, "STORED\r\nVALUE k%d %d %d\r\n%s\r\nEND\r\nNOT_FOUND\r\nDELETED\r\n", i, i, len(v), v)
		}
		c := dial(t, ts.addr)
		c.send([]byte(in.String()))
		c.expect(want.String())
	})
	t.Run("binary getq then noop", func(t *testing.T) {
		c := dial(t, ts.addr)
		var sets []byte
		for i := 0; i < 100; i += 2 {
			sets = append(sets, binSet(uint32(i), fmt.Sprintf("q%d", i), fmt.Sprint(i), 0)...)
		}
		c.send(sets)
		for i := 0; i < 100; i += 2 {
			if a := c.readBinary(); a.Status != 0 || a.Opaque != uint32(i) {
				t.Fatalf("set %d: %+v", i, a)
			}
		}
		var gets []byte
		for i := range 100 {
			gets = append(gets, binRequest(opGetQ, uint32(i), nil, []byte(fmt.Sprintf("q%d", i)), nil)...)
		}
		c.send(append(gets, binRequest(opNoop, 1000, nil, nil, nil)...))
		// Only the hits are answered, in order, then the noop.
		for i := 0; i < 100; i += 2 {
			want := binAnswer{Opcode: opGetQ, Opaque: uint32(i), Ext: flagsExt(0), Value: fmt.Sprint(i)}
			if got := c.readBinary(); got != want {
				t.Fatalf("getq %d: got %+v, want %+v", i, got, want)
			}
		}
		if got, want := c.readBinary(), (binAnswer{Opcode: opNoop, Opaque: 1000}); got != want {
			t.Fatalf("noop: got %+v, want %+v", got, want)
		}
	})
}

// TestPipelineOneWrite checks the answers to a pipeline that arrives in one segment, and
// reports how many write system calls they took. The requests run at once and the answers
// that are ready together share a write, so it is a few rather than one per request; how
// few depends on scheduling, so the figure is logged, not asserted (BenchmarkPipeline
// reports it as writes/op).
func TestPipelineOneWrite(t *testing.T) {
	const n = 100
	tests := []struct {
		name  string
		setup []byte // stores the keys; its answers are read before the pipeline
		read  func(c *client)
		in    []byte // the pipeline, sent in one write
		check func(c *client)
	}{
		{
			name: "text gets",
			setup: func() []byte {
				var b []byte
				for i := range n {
					b = fmt.Appendf(b, "set key%02d 0 0 5\r\nvalue\r\n", i)
				}
				return b
			}(),
			read: func(c *client) { c.expect(strings.Repeat("STORED\r\n", n)) },
			in: func() []byte {
				var b []byte
				for i := range n {
					b = fmt.Appendf(b, "get key%02d\r\n", i)
				}
				return b
			}(),
			check: func(c *client) {
				var want []byte
				for i := range n {
					want = fmt.Appendf(want, "VALUE key%02d 0 5\r\nvalue\r\nEND\r\n", i)
				}
				c.expect(string(want))
			},
		},
		{
			name: "binary getks",
			setup: func() []byte {
				var b []byte
				for i := range n {
					b = append(b, binSet(uint32(i), fmt.Sprintf("key%02d", i), "value", 0)...)
				}
				return b
			}(),
			read: func(c *client) {
				for range n {
					c.readBinary()
				}
			},
			in: func() []byte {
				var b []byte
				for i := range n {
					b = append(b, binRequest(opGetK, uint32(i), nil, []byte(fmt.Sprintf("key%02d", i)), nil)...)
				}
				return b
			}(),
			check: func(c *client) {
				for i := range n {
					want := binAnswer{Opcode: opGetK, Opaque: uint32(i), Ext: flagsExt(0), Key: fmt.Sprintf("key%02d", i), Value: "value"}
					if got := c.readBinary(); got != want {
						t.Fatalf("getk %d: got %+v, want %+v", i, got, want)
					}
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := startProxy(t)
			c := dial(t, ts.addr)
			c.send(tt.setup)
			tt.read(c)
			sc := ts.ln.conn(0)
			before := sc.writes.Load()
			c.send(tt.in)
			tt.check(c)
			writes := sc.writes.Load() - before
			t.Logf("%d pipelined requests (%d bytes in one write) answered in %d writes", n, len(tt.in), writes)
		})
	}
}

// TestMalformed sends inputs memcached 1.6.18 rejects through a real connection: each gets
// memcached's exact answer, then the connection either still answers (text: version,
// binary: noop) or is closed, as memcached does.
func TestMalformed(t *testing.T) {
	ts := startProxy(t)
	text := []struct {
		name   string
		in     string
		want   string
		closes bool
	}{
		{name: "unknown command", in: "bogus\r\n", want: "ERROR\r\n"},
		{name: "key too long", in: "get " + strings.Repeat("k", 251) + "\r\n", want: "CLIENT_ERROR bad command line format\r\n"},
		{name: "bad data chunk", in: "set s 0 0 5\r\nhelloXX", want: "CLIENT_ERROR bad data chunk\r\n"},
		{name: "bad delta", in: "incr n abc\r\n", want: "CLIENT_ERROR invalid numeric delta argument\r\n"},
		{name: "value too large", in: "set s 0 0 1048577\r\n" + strings.Repeat("a", 1048577) + "\r\n", want: "SERVER_ERROR object too large for cache\r\n"},
		{name: "quit", in: "quit\r\n", closes: true},
		{name: "http request", in: "GET / HTTP/1.1\r\n", closes: true},
		{name: "long line without newline", in: strings.Repeat("x", 5000), closes: true},
	}
	for _, tt := range text {
		t.Run("text "+tt.name, func(t *testing.T) {
			c := dial(t, ts.addr)
			go c.nc.Write([]byte(tt.in + "version\r\n")) // a big value may not fit the socket buffers before the answer
			c.expect(tt.want)
			if tt.closes {
				c.expectEOF()
			} else {
				c.expect(versionAnswer)
			}
		})
	}

	noop := binRequest(opNoop, 0xabcd, nil, nil, nil)
	noopAnswer := binAnswer{Opcode: opNoop, Opaque: 0xabcd}
	big := make([]byte, 1<<20+1)
	binaryCases := []struct {
		name   string
		in     []byte
		want   []binAnswer // before the noop's answer, or before the close
		closes bool
	}{
		{name: "unknown opcode", in: binRequest(0x40, 5, nil, nil, []byte("xyz")),
			want: []binAnswer{{Opcode: 0x40, Status: 0x81, Opaque: 5, Value: "Unknown command"}}},
		{name: "value too large", in: binRequest(opSet, 5, make([]byte, 8), []byte("k"), big),
			want: []binAnswer{{Opcode: opSet, Status: 0x03, Opaque: 5, Value: "Too large."}}},
		{name: "get with extras", in: binRequest(opGet, 5, []byte{0, 0, 0, 0}, []byte("k"), nil), closes: true,
			want: []binAnswer{{Opcode: opGet, Status: 0x04, Opaque: 5, Value: "Invalid arguments"}}},
		{name: "key too long", in: binRequest(opGet, 5, nil, bytes.Repeat([]byte("k"), 251), nil), closes: true,
			want: []binAnswer{{Opcode: opGet, Status: 0x04, Opaque: 5, Value: "Invalid arguments"}}},
		{name: "bad magic after a noop", closes: true,
			in:   append(binRequest(opNoop, 1, nil, nil, nil), binPacket(0x81, opNoop, 2, nil, nil, nil, 0)...),
			want: []binAnswer{{Opcode: opNoop, Opaque: 1}}},
		{name: "quit", in: binRequest(opQuit, 5, nil, nil, nil), closes: true,
			want: []binAnswer{{Opcode: opQuit, Opaque: 5}}},
		{name: "quitq", in: binRequest(opQuitQ, 5, nil, nil, nil), closes: true},
	}
	for _, tt := range binaryCases {
		t.Run("binary "+tt.name, func(t *testing.T) {
			c := dial(t, ts.addr)
			go c.nc.Write(append(append([]byte(nil), tt.in...), noop...))
			for _, w := range tt.want {
				if got := c.readBinary(); got != w {
					t.Fatalf("got %+v, want %+v", got, w)
				}
			}
			if tt.closes {
				c.expectEOF()
			} else if got := c.readBinary(); got != noopAnswer {
				t.Fatalf("after the error: got %+v, want the noop's answer", got)
			}
		})
	}
}

// largestValue is the largest value memcached 1.6.18 (and the embedded store) keeps under
// a key of keyLen bytes with non-zero client flags: the item, header and key included,
// fits in 1 MiB.
func largestValue(keyLen int) []byte {
	return bytes.Repeat([]byte("x"), 1<<20-59-4-keyLen)
}

// TestLargeValue stores and reads back the largest value an item may hold.
func TestLargeValue(t *testing.T) {
	ts := startProxy(t)
	t.Run("text", func(t *testing.T) {
		value := largestValue(len("big"))
		c := dial(t, ts.addr)
		go c.nc.Write(fmt.Appendf(nil, "set big 3 0 %d\r\n%s\r\nget big\r\n", len(value), value))
		c.expect(fmt.Sprintf("STORED\r\nVALUE big 3 %d\r\n%s\r\nEND\r\n", len(value), value))
	})
	t.Run("binary", func(t *testing.T) {
		value := largestValue(len("bigb"))
		c := dial(t, ts.addr)
		go c.nc.Write(append(binSet(1, "bigb", string(value), 4), binRequest(opGet, 2, nil, []byte("bigb"), nil)...))
		if got := c.readBinary(); got != (binAnswer{Opcode: opSet, Opaque: 1}) {
			t.Fatalf("set: %+v", got)
		}
		got := c.readBinary()
		if got.Status != 0 || got.Opaque != 2 || got.Ext != flagsExt(4) || got.Value != string(value) {
			t.Fatalf("get: status %#x opaque %d ext %x, %d bytes of value (want %d)", got.Status, got.Opaque, got.Ext, len(got.Value), len(value))
		}
	})
}

// TestHugeClaimedLength checks that a length the client only claims is answered without
// the server allocating it.
func TestHugeClaimedLength(t *testing.T) {
	ts := startProxy(t)
	tests := []struct {
		name string
		in   []byte
		want func(c *client)
	}{
		{name: "text set of 1 GB", in: []byte("set k 0 0 1000000000\r\n"), want: func(c *client) {
			c.expect("SERVER_ERROR object too large for cache\r\n")
		}},
		{name: "binary set of 4 GiB", in: binPacket(0x80, opSet, 9, make([]byte, 8), []byte("k"), nil, 0xffffffff), want: func(c *client) {
			if got, want := c.readBinary(), (binAnswer{Opcode: opSet, Status: 0x03, Opaque: 9, Value: "Too large."}); got != want {
				t.Fatalf("got %+v, want %+v", got, want)
			}
		}},
		{name: "binary get of 4 GiB", in: binPacket(0x80, opGet, 9, nil, []byte("k"), nil, 0xffffffff), want: func(c *client) {
			if got, want := c.readBinary(), (binAnswer{Opcode: opGet, Status: 0x04, Opaque: 9, Value: "Invalid arguments"}); got != want {
				t.Fatalf("got %+v, want %+v", got, want)
			}
			c.expectEOF()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			c := dial(t, ts.addr)
			c.send(tt.in)
			tt.want(c)
			runtime.ReadMemStats(&after)
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
				t.Errorf("allocated %d MiB while answering", grew>>20)
			}
		})
	}
}
