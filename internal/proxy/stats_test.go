package proxy_test

import (
	"context"
	"os"
	"strconv"
	"testing"

	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/proxy"
	"github.com/moxi-proxy/moxi/internal/topology"
)

func statsMap(t *testing.T, p *proxy.Proxy, args string) map[string]string {
	t.Helper()
	r := handle(p, &protocol.Request{Op: protocol.OpStats, Args: []byte(args)})
	if len(r) != 1 || r[0].Status != protocol.StatusOK {
		t.Fatalf("stats %q: %+v", args, r)
	}
	m := make(map[string]string, len(r[0].Stats))
	for _, s := range r[0].Stats {
		if _, dup := m[s.Name]; dup {
			t.Errorf("stats %q: %s twice", args, s.Name)
		}
		m[s.Name] = s.Value
	}
	return m
}

func TestStats(t *testing.T) {
	topo, _, _ := twoPools(t)
	p := proxy.New(topo, proxy.Options{
		Release:        "9.9.0",
		Build:          "9.9",
		Connections:    func() (uint64, uint64) { return 7, 9 },
		MaxConnections: 123,
	})
	set(t, p, "a", "1")
	set(t, p, "sess:b", "2")
	get(p, "a", "sess:b", "missing") // 2 hits, 1 miss
	get(p, "missing2")
	handle(p, &protocol.Request{Op: protocol.OpDelete, Key: []byte("a")})
	handle(p, &protocol.Request{Op: protocol.OpDelete, Key: []byte("a")})
	handle(p, &protocol.Request{Op: protocol.OpIncr, Key: []byte("sess:b"), Delta: 5})
	handle(p, &protocol.Request{Op: protocol.OpIncr, Key: []byte("nope"), Delta: 5})
	handle(p, &protocol.Request{Op: protocol.OpCas, Key: []byte("sess:b"), Value: []byte("x"), Cas: 999999})
	handle(p, &protocol.Request{Op: protocol.OpTouch, Key: []byte("sess:b")})
	handle(p, &protocol.Request{Op: protocol.OpFlushAll})

	st := statsMap(t, p, "")
	want := map[string]string{
		"pid":               strconv.Itoa(os.Getpid()),
		"version":           "9.9.0 moxi/9.9",
		"max_connections":   "123",
		"curr_connections":  "7",
		"total_connections": "9",
		"cmd_get":           "4",
		"get_hits":          "2",
		"get_misses":        "2",
		"cmd_set":           "3", // two sets and the cas
		"cas_badval":        "1",
		"delete_hits":       "1",
		"delete_misses":     "1",
		"incr_hits":         "1",
		"incr_misses":       "1",
		"touch_hits":        "1",
		"cmd_touch":         "1",
		"cmd_flush":         "1",
	}
	for name, v := range want {
		if got, ok := st[name]; !ok || got != v {
			t.Errorf("STAT %s = %q (present %v), want %q", name, got, ok, v)
		}
	}
	for _, name := range []string{"uptime", "time", "rusage_user", "rusage_system", "threads"} {
		if _, err := strconv.ParseFloat(st[name], 64); err != nil {
			t.Errorf("STAT %s = %q, want a number", name, st[name])
		}
	}
}

func TestStatsProxy(t *testing.T) {
	topo, _, _ := twoPools(t)
	p := proxy.New(topo, proxy.Options{})
	set(t, p, "sess:x", "v")
	st := statsMap(t, p, "proxy")
	items := 0
	for _, pl := range topo.Pools {
		for i := range pl.Len() {
			m := pl.Member(i)
			prefix := pl.Name() + ":" + m.Name + ":"
			if got := st[prefix+"addr"]; got != m.Addr {
				t.Errorf("%saddr = %q, want %q", prefix, got, m.Addr)
			}
			if got := st[prefix+"weight"]; got != "1" {
				t.Errorf("%sweight = %q, want 1", prefix, got)
			}
			n, err := strconv.Atoi(st[prefix+"curr_items"])
			if err != nil {
				t.Errorf("%scurr_items = %q: %v", prefix, st[prefix+"curr_items"], err)
			}
			items += n
		}
	}
	if items != 1 {
		t.Errorf("servers report %d items in all, want 1", items)
	}
}

// TestStatsGroups: every group memcached knows gets memcached's answer form, so that no
// client waits for an END that never comes.
func TestStatsGroups(t *testing.T) {
	topo, _, _ := twoPools(t)
	p := proxy.New(topo, proxy.Options{Settings: func() []protocol.Stat {
		return []protocol.Stat{{Name: "listen", Value: "127.0.0.1:11211"}}
	}})
	for _, tc := range []struct{ args, answer string }{
		{"settings", "STAT listen 127.0.0.1:11211\r\nEND\r\n"},
		{"items", "END\r\n"},
		{"slabs", "END\r\n"},
		{"sizes", "END\r\n"},
		{"conns", "END\r\n"},
		{"cachedump 1 10", "END\r\n"},
		{"cachedump 1", "CLIENT_ERROR bad command line\r\n"},
		{"cachedump x 10", "CLIENT_ERROR bad command line format\r\n"},
		{"cachedump 64 10", "CLIENT_ERROR Illegal slab id\r\n"},
		{"detail on", "OK\r\n"},
		{"detail off", "OK\r\n"},
		{"detail dump", "END\r\n"},
		{"detail", "CLIENT_ERROR usage: stats detail on|off|dump\r\n"},
		{"reset", "RESET\r\n"},
		{"bogus", "ERROR\r\n"},
	} {
		req := &protocol.Request{Op: protocol.OpStats, Args: []byte(tc.args)}
		r := handle(p, req)
		if got := string(protocol.AppendTextResponse(nil, req, r)); got != tc.answer {
			t.Errorf("stats %s: %q, want %q", tc.args, got, tc.answer)
		}
	}
}

func TestStatsReset(t *testing.T) {
	topo, _, _ := twoPools(t)
	p := proxy.New(topo, proxy.Options{})
	get(p, "a")
	if st := statsMap(t, p, ""); st["cmd_get"] != "1" || st["get_misses"] != "1" {
		t.Fatalf("before reset: cmd_get %s get_misses %s", st["cmd_get"], st["get_misses"])
	}
	handle(p, &protocol.Request{Op: protocol.OpStats, Args: []byte("reset")})
	if st := statsMap(t, p, ""); st["cmd_get"] != "0" || st["get_misses"] != "0" {
		t.Errorf("after reset: cmd_get %s get_misses %s", st["cmd_get"], st["get_misses"])
	}
}

func getHitSetup(t testing.TB) (*proxy.Proxy, []protocol.Request, []protocol.Response) {
	pl := newPool(t, "main", 1)
	p := proxy.New(&topology.Topology{Pools: []*pool.Pool{pl}, Default: pl}, proxy.Options{})
	set(t, p, "key", "value")
	req := []protocol.Request{{Op: protocol.OpGet, Keys: [][]byte{[]byte("key")}}}
	resps := p.Handle(context.Background(), nil, req, make([]protocol.Response, 0, 4))
	if resps[0].Status != protocol.StatusOK {
		t.Fatalf("get: %+v", resps[0])
	}
	return p, req, resps
}

func BenchmarkHandleGetHit(b *testing.B) {
	p, req, resps := getHitSetup(b)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		resps = p.Handle(ctx, nil, req, resps[:0])
	}
}
