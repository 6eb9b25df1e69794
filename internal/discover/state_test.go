package discover

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/dnstest"
)

// clock is a Set's clock that the test moves.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// poll asks source's name once, as Run would, and reports whether its list changed.
func poll(t *testing.T, set *Set, source string) bool {
	t.Helper()
	p := set.pools[source]
	if p == nil {
		t.Fatalf("%s is not followed", source)
	}
	return set.poll(context.Background(), p)
}

// handoverConfig follows mc.test's A records (pool a, and zone z1 of pool zoned) and
// srv.test's SRV records (pool s), all with remove_after 1m.
func handoverConfig(dns *dnstest.Server) *config.Config {
	a := &config.Discover{DNS: "mc.test.", Port: 11211, Interval: time.Second, RemoveAfter: time.Minute, Resolver: dns.Addr}
	srv := &config.Discover{DNS: "srv.test.", SRV: true, Interval: time.Second, RemoveAfter: time.Minute, Resolver: dns.Addr}
	return &config.Config{Pools: []*config.Pool{
		{Name: "a", Discover: a},
		{Name: "s", Discover: srv},
		{Name: "zoned", Zones: []string{"z0", "z1"}, ZoneDiscover: map[string]*config.Discover{"z1": a},
			Servers: []config.Server{{Addr: "127.0.0.9:1", Weight: 1, Zone: "z0"}}},
		{Name: "plain", Servers: []config.Server{{Addr: "127.0.0.1:1", Weight: 1}}},
	}}
}

// predecessor is a Set that has followed cfg's pools on its own clock, starting at t0:
// mc.test answered 127.0.0.1 and .2, then from t0+10s .1 only, and it is now t0+40s, so
// that .2 has been missing for 30s of remove_after's 1m.
func predecessor(t *testing.T, dns *dnstest.Server, cfg *config.Config) *Set {
	t.Helper()
	t0 := &clock{time.Unix(1000, 0)}
	set := New(cfg, Options{})
	set.now = t0.now
	dns.SetIPs("mc.test", "127.0.0.1", "127.0.0.2")
	dns.SetSRV("srv.test", dnstest.SRV{Target: "pod-0.test", Port: 7000, Weight: 1})
	dns.SetIPs("pod-0.test", "127.0.0.5")
	for source := range set.pools {
		poll(t, set, source)
	}
	t0.t = t0.t.Add(10 * time.Second)
	dns.SetIPs("mc.test", "127.0.0.1")
	for _, source := range []string{"a", "zoned/z1"} {
		if poll(t, set, source) {
			t.Fatalf("%s: 127.0.0.2 missing for 0s of 1m changed the list", source)
		}
	}
	t0.t = t0.t.Add(30 * time.Second)
	return set
}

// TestImportServesWithoutLookup: a Set that imports its predecessor's state serves the
// same lists, ready, without asking DNS.
func TestImportServesWithoutLookup(t *testing.T) {
	dns := dnstest.Start(t)
	cfg := handoverConfig(dns)
	old := predecessor(t, dns, cfg)
	asked := dns.Queries()

	set := New(cfg, Options{})
	set.Import(old.Export())
	if got := set.Pending(); len(got) != 0 {
		t.Errorf("pending after Import: %v", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := set.Wait(ctx); err != nil {
		t.Errorf("Wait after Import: %v", err)
	}
	for _, source := range []string{"a", "s", "zoned/z1"} {
		want, _ := old.Servers(source)
		got, answered := set.Servers(source)
		if !answered || names(got) != names(want) {
			t.Errorf("%s: %s (answered %t), want %s", source, names(got), answered, names(want))
		}
	}
	filled, err := set.Filled(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := names(filled.Pools[2].Servers), "127.0.0.9:1=127.0.0.9:1/1 127.0.0.1=127.0.0.1:11211/1 127.0.0.2=127.0.0.2:11211/1"; got != want {
		t.Errorf("zoned pool filled with %s, want %s", got, want)
	}
	if n := dns.Queries(); n != asked {
		t.Errorf("%d DNS questions after Import, want none", n-asked)
	}
}

// TestImportKeepsMissingClock: a server missing for 30s of remove_after's 1m before the
// handover is removed 30s after it on the successor's clock, whatever that clock reads;
// one answered again is missing no more.
func TestImportKeepsMissingClock(t *testing.T) {
	dns := dnstest.Start(t)
	cfg := handoverConfig(dns)
	states := predecessor(t, dns, cfg).Export()
	const kept, gone = "127.0.0.1=127.0.0.1:11211/1 127.0.0.2=127.0.0.2:11211/1", "127.0.0.1=127.0.0.1:11211/1"

	t.Run("still missing", func(t *testing.T) {
		t1 := &clock{time.Unix(5_000_000, 0)}
		set := New(cfg, Options{})
		set.now = t1.now
		set.Import(states)
		t1.t = t1.t.Add(29 * time.Second)
		if poll(t, set, "a") {
			t.Errorf("missing 59s of 1m: list changed")
		}
		if got, _ := set.Servers("a"); names(got) != kept {
			t.Errorf("missing 59s of 1m: %s, want %s", names(got), kept)
		}
		t1.t = t1.t.Add(time.Second)
		if !poll(t, set, "a") {
			t.Errorf("missing 1m: no change reported")
		}
		if got, _ := set.Servers("a"); names(got) != gone {
			t.Errorf("missing 1m: %s, want %s", names(got), gone)
		}
	})

	t.Run("answered again", func(t *testing.T) {
		t1 := &clock{time.Unix(5_000_000, 0)}
		set := New(cfg, Options{})
		set.now = t1.now
		set.Import(states)
		dns.SetIPs("mc.test", "127.0.0.1", "127.0.0.2")
		poll(t, set, "a")
		dns.SetIPs("mc.test", "127.0.0.1")
		t1.t = t1.t.Add(time.Second)
		poll(t, set, "a") // missing again, from now
		t1.t = t1.t.Add(59*time.Second - time.Nanosecond)
		poll(t, set, "a")
		if got, _ := set.Servers("a"); names(got) != kept {
			t.Errorf("answered, then missing for just under 1m: %s, want %s", names(got), kept)
		}
	})
}

// TestImportLeavesOut: a state seeds only a pool the Set follows by asking the same, and
// not one that has answered already.
func TestImportLeavesOut(t *testing.T) {
	dns := dnstest.Start(t)
	dns.SetIPs("mc.test", "127.0.0.3")
	endpoint := &config.Discover{ConfigEndpoint: "127.0.0.1:1", Interval: time.Second}
	cfg := &config.Config{Pools: []*config.Pool{
		{Name: "a", Discover: &config.Discover{DNS: "mc.test.", Port: 11211, Interval: time.Second, RemoveAfter: time.Minute, Resolver: dns.Addr}},
		{Name: "answered", Discover: &config.Discover{DNS: "mc.test.", Port: 11211, Interval: time.Second, RemoveAfter: time.Minute, Resolver: dns.Addr}},
		{Name: "e", Discover: endpoint},
	}}
	servers := []ServerState{{Name: "node-0", Addr: "10.0.0.1:11211", Weight: 1}}
	for _, tc := range []struct {
		name     string
		state    PoolState
		source   string // the pool looked at
		answered bool
		servers  string // its list after Import
		pending  []string
		version  int64
		resolved bool // "answered" has had its answer before Import
	}{
		{name: "not followed", state: PoolState{Name: "gone", Kind: "a", Servers: servers}, source: "gone",
			pending: []string{"a", "answered", "e"}},
		{name: "srv state, a pool", state: PoolState{Name: "a", Kind: "srv", Servers: servers}, source: "a",
			pending: []string{"a", "answered", "e"}},
		{name: "another endpoint", state: PoolState{Name: "e", Kind: "config_endpoint 10.0.0.9:11211", Servers: servers, Version: 7}, source: "e",
			pending: []string{"a", "answered", "e"}},
		{name: "no servers", state: PoolState{Name: "a", Kind: "a"}, source: "a",
			pending: []string{"a", "answered", "e"}},
		{name: "answered already", state: PoolState{Name: "answered", Kind: "a", Servers: servers}, source: "answered", resolved: true,
			answered: true, servers: "127.0.0.3=127.0.0.3:11211/1", pending: []string{"a", "e"}},
		{name: "same endpoint", state: PoolState{Name: "e", Kind: "config_endpoint 127.0.0.1:1", Servers: servers, Version: 7}, source: "e",
			answered: true, servers: "node-0=10.0.0.1:11211/1", pending: []string{"a", "answered"}, version: 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := New(cfg, Options{})
			if tc.resolved {
				poll(t, set, "answered")
			}
			set.Import([]PoolState{tc.state})
			got, answered := set.Servers(tc.source)
			if answered != tc.answered || names(got) != tc.servers {
				t.Errorf("%s: %s (answered %t), want %s (answered %t)", tc.source, names(got), answered, tc.servers, tc.answered)
			}
			if p := set.Pending(); !slices.Equal(p, tc.pending) {
				t.Errorf("pending %v, want %v", p, tc.pending)
			}
			if v := set.pools["e"].version; v != tc.version {
				t.Errorf("endpoint version %d, want %d", v, tc.version)
			}
		})
	}
}

// TestPoolStateJSON: an exported state survives JSON unchanged, and seeds as the original
// does.
func TestPoolStateJSON(t *testing.T) {
	dns := dnstest.Start(t)
	cfg := handoverConfig(dns)
	states := predecessor(t, dns, cfg).Export()
	if a := states[0]; a.Name != "a" || a.Missing["127.0.0.2"] != 30*time.Second {
		t.Fatalf("exported %+v, want pool a with 127.0.0.2 missing for 30s", a)
	}
	b, err := json.Marshal(states)
	if err != nil {
		t.Fatal(err)
	}
	var back []PoolState
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, states) {
		t.Fatalf("JSON round trip:\n%s\ngave %+v,\nwant %+v", b, back, states)
	}
	set := New(cfg, Options{})
	set.now = (&clock{time.Unix(5_000_000, 0)}).now
	set.Import(back)
	if !reflect.DeepEqual(set.Export(), states) {
		t.Errorf("Export after Import of the JSON: %+v, want %+v", set.Export(), states)
	}
}
