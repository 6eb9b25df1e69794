package proxy_test

import (
	"encoding/binary"
	"fmt"
	"sync"
	"testing"

	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/proxy"
)

// text answers req as a text client reads it.
func text(p *proxy.Proxy, req *protocol.Request) string {
	return string(protocol.AppendTextResponse(nil, req, handle(p, req)))
}

func stats(args string) *protocol.Request {
	return &protocol.Request{Op: protocol.OpStats, Args: []byte(args)}
}

// TestStatsDetail follows memcached's t/stats-detail.t, then the cases it leaves out: which
// commands count, which keys have a prefix, the dump order, binary requests.
func TestStatsDetail(t *testing.T) {
	key := func(k string) [][]byte { return [][]byte{[]byte(k)} }
	for _, tc := range []struct {
		name string
		reqs []*protocol.Request // sent in order, after "stats detail on"
		want string              // then the answer to "stats detail dump"
	}{
		{"nothing", nil, "END\r\n"},
		{"set", []*protocol.Request{
			{Op: protocol.OpSet, Key: []byte("foo:123"), Value: []byte("fooval")},
		}, "PREFIX foo get 0 hit 0 set 1 del 0\r\nEND\r\n"},
		{"get hit, get miss, delete miss", []*protocol.Request{
			{Op: protocol.OpSet, Key: []byte("foo:123"), Value: []byte("fooval")},
			{Op: protocol.OpGet, Keys: key("foo:123")},
			{Op: protocol.OpGet, Keys: key("foo:124")},
			{Op: protocol.OpDelete, Key: []byte("foo:125")},
		}, "PREFIX foo get 2 hit 1 set 1 del 1\r\nEND\r\n"},
		{"each key of a multi-get", []*protocol.Request{
			{Op: protocol.OpSet, Key: []byte("a:1"), Value: []byte("x")},
			{Op: protocol.OpGets, Keys: [][]byte{[]byte("a:1"), []byte("a:2"), []byte("b:1"), []byte("nodelim")}},
			{Op: protocol.OpGat, Keys: key("a:1")},
		}, "PREFIX a get 3 hit 2 set 1 del 0\r\nPREFIX b get 1 hit 0 set 0 del 0\r\nEND\r\n"},
		{"every set-type write, whatever its outcome", []*protocol.Request{
			{Op: protocol.OpAdd, Key: []byte("w:1"), Value: []byte("x")},
			{Op: protocol.OpAdd, Key: []byte("w:1"), Value: []byte("x")}, // not stored
			{Op: protocol.OpReplace, Key: []byte("w:2"), Value: []byte("x")},
			{Op: protocol.OpAppend, Key: []byte("w:1"), Value: []byte("x")},
			{Op: protocol.OpPrepend, Key: []byte("w:1"), Value: []byte("x")},
			{Op: protocol.OpCas, Key: []byte("w:1"), Value: []byte("x"), Cas: 12345},
		}, "PREFIX w get 0 hit 0 set 6 del 0\r\nEND\r\n"},
		{"not counted: text touch, incr, decr, meta", []*protocol.Request{
			{Op: protocol.OpSet, Key: []byte("n:1"), Value: []byte("1")},
			{Op: protocol.OpTouch, Key: []byte("n:1")},
			{Op: protocol.OpIncr, Key: []byte("n:1"), Delta: 1},
			{Op: protocol.OpDecr, Key: []byte("n:1"), Delta: 1},
			{Op: protocol.OpMetaGet, Key: []byte("n:1")},
			{Op: protocol.OpMetaDelete, Key: []byte("n:1")},
		}, "PREFIX n get 0 hit 0 set 1 del 0\r\nEND\r\n"},
		{"binary touch counts as a get", []*protocol.Request{
			{Op: protocol.OpSet, Key: []byte("t:1"), Value: []byte("x"), Binary: true},
			{Op: protocol.OpTouch, Key: []byte("t:1"), Binary: true},
			{Op: protocol.OpTouch, Key: []byte("t:2"), Binary: true},
		}, "PREFIX t get 2 hit 1 set 1 del 0\r\nEND\r\n"},
		{"prefix up to the first delimiter, empty allowed", []*protocol.Request{
			{Op: protocol.OpSet, Key: []byte("a:b:c"), Value: []byte("x")},
			{Op: protocol.OpSet, Key: []byte(":x"), Value: []byte("x")},
			{Op: protocol.OpSet, Key: []byte("plain"), Value: []byte("x")},
			{Op: protocol.OpSet, Key: []byte("nul\x00:x"), Value: []byte("x"), Binary: true},
		}, "PREFIX  get 0 hit 0 set 1 del 0\r\nPREFIX a get 0 hit 0 set 1 del 0\r\nEND\r\n"},
		{"sorted by prefix", []*protocol.Request{
			{Op: protocol.OpDelete, Key: []byte("zz:1")},
			{Op: protocol.OpDelete, Key: []byte("b:1")},
			{Op: protocol.OpDelete, Key: []byte("ab:1")},
		}, "PREFIX ab get 0 hit 0 set 0 del 1\r\nPREFIX b get 0 hit 0 set 0 del 1\r\nPREFIX zz get 0 hit 0 set 0 del 1\r\nEND\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topo, _, _ := twoPools(t)
			p := proxy.New(topo, proxy.Options{})
			if got := text(p, stats("detail on")); got != "OK\r\n" {
				t.Fatalf("stats detail on: %q", got)
			}
			for _, req := range tc.reqs {
				handle(p, req)
			}
			if got := text(p, stats("detail dump")); got != tc.want {
				t.Errorf("stats detail dump:\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}

// TestStatsDetailOnOffReset: nothing is counted until on or after off; what was counted
// stays through off; reset forgets it, but not whether collection is on.
func TestStatsDetailOnOffReset(t *testing.T) {
	topo, _, _ := twoPools(t)
	p := proxy.New(topo, proxy.Options{})
	del := &protocol.Request{Op: protocol.OpDelete, Key: []byte("k:1")}
	for _, step := range []struct {
		req  *protocol.Request
		want string // the answer to req, or to "stats detail dump" when req is nil
	}{
		{del, "NOT_FOUND\r\n"},
		{nil, "END\r\n"}, // off: not counted
		{stats("detail on"), "OK\r\n"},
		{del, "NOT_FOUND\r\n"},
		{nil, "PREFIX k get 0 hit 0 set 0 del 1\r\nEND\r\n"},
		{stats("detail off"), "OK\r\n"},
		{del, "NOT_FOUND\r\n"},
		{nil, "PREFIX k get 0 hit 0 set 0 del 1\r\nEND\r\n"}, // kept, not counted
		{stats("detail on"), "OK\r\n"},
		{stats("reset"), "RESET\r\n"},
		{nil, "END\r\n"},
		{del, "NOT_FOUND\r\n"},
		{nil, "PREFIX k get 0 hit 0 set 0 del 1\r\nEND\r\n"}, // still on
		{stats("detail"), "CLIENT_ERROR usage: stats detail on|off|dump\r\n"},
		{stats("detail bogus"), "CLIENT_ERROR usage: stats detail on|off|dump\r\n"},
		{stats("detail off extra"), "OK\r\n"}, // memcached reads the first word only
	} {
		req := step.req
		if req == nil {
			req = stats("detail dump")
		}
		if got := text(p, req); got != step.want {
			t.Errorf("%s %s: %q, want %q", req.Op, req.Args, got, step.want)
		}
	}
}

// TestStatsDetailBinary: memcached's binary answers: on/off an empty stats answer, dump one
// stat "detailed" holding the text answer, END included; an unknown subcommand not found.
func TestStatsDetailBinary(t *testing.T) {
	topo, _, _ := twoPools(t)
	p := proxy.New(topo, proxy.Options{})
	bin := func(args string) []byte {
		req := &protocol.Request{Op: protocol.OpStats, Args: []byte(args), Binary: true, Opcode: 0x10}
		r := handle(p, req)
		return protocol.AppendBinaryResponse(nil, req, &r[0])
	}
	// packet is one binary stat answer: status, key, value.
	packet := func(status uint16, key, value string) string {
		b := make([]byte, 24, 24+len(key)+len(value))
		b[0], b[1] = 0x81, 0x10
		binary.BigEndian.PutUint16(b[2:], uint16(len(key)))
		binary.BigEndian.PutUint16(b[6:], status)
		binary.BigEndian.PutUint32(b[8:], uint32(len(key)+len(value)))
		return string(append(append(b, key...), value...))
	}
	end := packet(0, "", "")
	if got := string(bin("detail on")); got != end {
		t.Errorf("detail on: %q, want %q", got, end)
	}
	handle(p, &protocol.Request{Op: protocol.OpDelete, Key: []byte("bd:1"), Binary: true})
	want := packet(0, "detailed", "PREFIX bd get 0 hit 0 set 0 del 1\r\nEND\r\n") + end
	if got := string(bin("detail dump")); got != want {
		t.Errorf("detail dump:\n%q\nwant\n%q", got, want)
	}
	if got := bin("detail bogus"); binary.BigEndian.Uint16(got[6:]) != protocol.BinStatusNotFound {
		t.Errorf("detail bogus: %q, want status not found", got)
	}
	if got := string(bin("detail off")); got != end {
		t.Errorf("detail off: %q, want %q", got, end)
	}
}

// TestStatsDetailBound: past maxPrefixes (10,000) prefixes, a new prefix is not counted and
// those counted go on.
func TestStatsDetailBound(t *testing.T) {
	topo, _, _ := twoPools(t)
	p := proxy.New(topo, proxy.Options{})
	handle(p, stats("detail on"))
	del := func(k string) { handle(p, &protocol.Request{Op: protocol.OpDelete, Key: []byte(k)}) }
	for i := range 10000 {
		del(fmt.Sprintf("p%05d:x", i))
	}
	del("new:x")
	del("p00000:x")
	dump := text(p, stats("detail dump"))
	if want := "PREFIX p00000 get 0 hit 0 set 0 del 2\r\n"; dump[:len(want)] != want {
		t.Errorf("first line %q, want %q", dump[:len(want)], want)
	}
	var lines int
	for i := range len(dump) {
		if dump[i] == '\n' {
			lines++
		}
	}
	if lines != 10001 { // the prefixes, then END
		t.Errorf("%d lines, want 10,000 prefixes and END", lines-1)
	}
}

// TestStatsDetailConcurrent counts from many goroutines, new prefixes and known ones, while
// a dump runs (for the race detector), then checks that no count was lost.
func TestStatsDetailConcurrent(t *testing.T) {
	topo, _, _ := twoPools(t)
	p := proxy.New(topo, proxy.Options{})
	handle(p, stats("detail on"))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 100 {
				handle(p, &protocol.Request{Op: protocol.OpDelete, Key: fmt.Appendf(nil, "g%d:%d", g%2, i)})
			}
		})
	}
	wg.Go(func() { handle(p, stats("detail dump")) })
	wg.Wait()
	want := "PREFIX g0 get 0 hit 0 set 0 del 400\r\nPREFIX g1 get 0 hit 0 set 0 del 400\r\nEND\r\n"
	if got := text(p, stats("detail dump")); got != want {
		t.Errorf("dump %q, want %q", got, want)
	}
}
