package proxy_test

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/proxy"
	"github.com/moxi-proxy/moxi/internal/topology"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// value is the sum of the samples of family name whose labels include want (name=value
// pairs), or -1 when there is none.
func value(t *testing.T, reg *prometheus.Registry, name string, want ...string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum, found := 0.0, false
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(want); i += 2 {
				if have[want[i]] != want[i+1] {
					continue next
				}
			}
			found = true
			if c := m.GetCounter(); c != nil {
				sum += c.GetValue()
			} else {
				sum += m.GetGauge().GetValue()
			}
		}
	}
	if !found {
		return -1
	}
	return sum
}

// down is a server that fails every request with a backend's error, which names its
// address.
type down struct{ failing }

func (down) Start(_ context.Context, order *turn.Turn, _ []protocol.Request, _ []protocol.Response, errs []error, done func()) {
	pool.Fail(order, errs, errors.New("127.0.0.1:1: server marked dead"), done)
}

func TestAnswerMetrics(t *testing.T) {
	pl := newPool(t, "main", 2)
	reg := prometheus.NewRegistry()
	p := proxy.New(&topology.Topology{Pools: []*pool.Pool{pl}, Default: pl}, proxy.Options{Registry: reg})
	set(t, p, "a", "1")
	set(t, p, "b", "2")
	get(p, "a", "b", "x")                                                            // 2 hits, 1 miss
	handle(p, &protocol.Request{Op: protocol.OpGat, Keys: [][]byte{[]byte("y")}})    // 1 miss
	handle(p, &protocol.Request{Op: protocol.OpMetaGet, Key: []byte("a")})           // 1 hit
	handle(p, &protocol.Request{Op: protocol.OpMetaGet, Key: []byte("zz")})          // 1 miss
	handle(p, &protocol.Request{Op: protocol.OpIncr, Key: []byte("nope"), Delta: 1}) // NOT_FOUND: an outcome
	handle(p, &protocol.Request{Op: protocol.OpSet, Key: []byte("n"), Value: []byte("x")})
	handle(p, &protocol.Request{Op: protocol.OpIncr, Key: []byte("n"), Delta: 1}) // CLIENT_ERROR: not a number
	p.CountRejected(&protocol.RequestError{Status: protocol.StatusUnknownCommand})
	p.CountRejected(&protocol.RequestError{Status: protocol.StatusInvalid, Msg: "bad data chunk"})
	p.CountRejected(&protocol.RequestError{Status: protocol.StatusTooLarge, Msg: "object too large for cache"})

	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"moxi_get_hits_total", []string{"pool", "main"}, 3},
		{"moxi_get_misses_total", []string{"pool", "main"}, 3},
		{"moxi_error_answers_total", []string{"kind", "client_error"}, 2},
		{"moxi_error_answers_total", []string{"kind", "client_error", "pool", "main"}, 1}, // the incr
		{"moxi_error_answers_total", []string{"kind", "client_error", "pool", ""}, 1},     // rejected: of no pool
		{"moxi_error_answers_total", []string{"kind", "error"}, 1},
		{"moxi_error_answers_total", []string{"kind", "server_error"}, 1},
		{"moxi_requests_total", []string{"pool", "main", "command", "get"}, 1},
		{"moxi_requests_total", []string{"pool", "main", "command", "set"}, 3},
		{"moxi_requests_total", []string{"command", "touch"}, -1}, // never asked: no series
	} {
		if got := value(t, reg, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}

	// A server that does not answer: SERVER_ERROR naming its address once; not counted
	// under noreply, which sends nothing.
	for _, c := range []struct{ name, msg string }{
		{"127.0.0.1:1", "backend 127.0.0.1:1: server marked dead"},
		{"mc3", "backend mc3 127.0.0.1:1: server marked dead"},
	} {
		bad, err := pool.New("bad", pool.Options{}, []pool.Member{{Name: c.name, Addr: "127.0.0.1:1", Weight: 1, Server: down{}}})
		if err != nil {
			t.Fatal(err)
		}
		p.Swap(&topology.Topology{Pools: []*pool.Pool{bad}, Default: bad})
		r := get(p, "k")
		if r[0].Status != protocol.StatusTempFailure || r[0].Msg != c.msg {
			t.Errorf("get from %s: %+v, want SERVER_ERROR %q", c.name, r[0], c.msg)
		}
		handle(p, &protocol.Request{Op: protocol.OpDelete, Key: []byte("k"), NoReply: true})
	}
	if got := value(t, reg, "moxi_error_answers_total", "kind", "server_error"); got != 3 {
		t.Errorf("server_error answers = %v, want 3", got)
	}
}

func TestFlushAllRefused(t *testing.T) {
	pl := newPool(t, "main", 2)
	p := proxy.New(&topology.Topology{Pools: []*pool.Pool{pl}, Default: pl, NoFlushAll: true}, proxy.Options{})
	set(t, p, "kept", "v")
	for _, c := range []struct {
		req  protocol.Request
		want string
	}{
		{protocol.Request{Op: protocol.OpFlushAll}, "CLIENT_ERROR flush_all not allowed\r\n"},
		// memcached -F: status 0x0020 with its text, quiet or not.
		{protocol.Request{Op: protocol.OpFlushAll, Binary: true, Opcode: 0x08, Opaque: 7},
			"\x81\x08\x00\x00\x00\x00\x00\x20\x00\x00\x00\x0d\x00\x00\x00\x07\x00\x00\x00\x00\x00\x00\x00\x00Auth failure."},
		{protocol.Request{Op: protocol.OpFlushAll, Binary: true, Opcode: 0x18, Quiet: true},
			"\x81\x18\x00\x00\x00\x00\x00\x20\x00\x00\x00\x0d\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00Auth failure."},
	} {
		r := handle(p, &c.req)
		var got []byte
		if c.req.Binary {
			got = protocol.AppendBinaryResponse(nil, &c.req, &r[0])
		} else {
			got = protocol.AppendTextResponse(nil, &c.req, r)
		}
		if string(got) != c.want {
			t.Errorf("%+v answered %q, want %q", c.req, got, c.want)
		}
	}
	if r := get(p, "kept"); r[0].Status != protocol.StatusOK {
		t.Errorf("a refused flush_all flushed: get kept = %+v", r[0])
	}
}
