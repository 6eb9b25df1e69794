package discover

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/dnstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// names is the "ring name=address/weight" of each server, in order.
func names(servers []config.Server) string {
	var out []string
	for _, s := range servers {
		out = append(out, s.RingName()+"="+s.Addr+"/"+string(rune('0'+s.Weight)))
	}
	return strings.Join(out, " ")
}

func TestLookup(t *testing.T) {
	dns := dnstest.Start(t)
	dns.SetIPs("mc.test", "127.0.0.3", "127.0.0.2", "::1")
	dns.SetSRV("_memcache._tcp.mc.test",
		dnstest.SRV{Target: "mc-1.mc.test", Port: 11212, Weight: 2},
		dnstest.SRV{Target: "mc-0.mc.test.", Port: 11211, Weight: 0})
	dns.SetIPs("mc-0.mc.test", "10.0.0.7")
	dns.SetIPs("mc-1.mc.test", "10.0.0.8")
	r := Resolver(dns.Addr)
	ctx := context.Background()

	got, err := Lookup(ctx, r, config.Discover{DNS: "mc.test.", Port: 11300})
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, func(a, b config.Server) int { return strings.Compare(a.Addr, b.Addr) })
	if want := "127.0.0.2:11300=127.0.0.2:11300/1 127.0.0.3:11300=127.0.0.3:11300/1 ::1:11300=[::1]:11300/1"; names(got) != want {
		t.Errorf("A/AAAA: %s, want %s", names(got), want)
	}

	got, err = Lookup(ctx, r, config.Discover{DNS: "_memcache._tcp.mc.test", SRV: true})
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, func(a, b config.Server) int { return strings.Compare(a.RingName(), b.RingName()) })
	// The target without its final dot and without the port is the ring name; weight 0 is 1.
	if want := "mc-0.mc.test=10.0.0.7:11211/1 mc-1.mc.test=10.0.0.8:11212/2"; names(got) != want {
		t.Errorf("SRV: %s, want %s", names(got), want)
	}
	// Records of one weight (Kubernetes: 100/n each) weigh 1, whatever n.
	dns.SetSRV("_memcache._tcp.mc.test",
		dnstest.SRV{Target: "mc-1.mc.test", Port: 11212, Weight: 33},
		dnstest.SRV{Target: "mc-0.mc.test.", Port: 11211, Weight: 33})
	got, err = Lookup(ctx, r, config.Discover{DNS: "_memcache._tcp.mc.test", SRV: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range got {
		if s.Weight != 1 {
			t.Errorf("SRV records of weight 33 each: %s weighs %d, want 1", s.RingName(), s.Weight)
		}
	}

	if _, err := Lookup(ctx, r, config.Discover{DNS: "nothing.test.", Port: 1}); err == nil {
		t.Error("NXDOMAIN gave no error")
	}
}

// TestMerge: a server missing from an answer stays until remove_after, comes back as
// found, and the list is ordered by ring name.
func TestMerge(t *testing.T) {
	p := &pool{opts: config.Discover{RemoveAfter: time.Minute}, missing: map[string]time.Time{}}
	a, b, c := config.Server{Addr: "10.0.0.1:1", Weight: 1}, config.Server{Addr: "10.0.0.2:1", Weight: 1}, config.Server{Addr: "10.0.0.3:1", Weight: 1}
	t0 := time.Unix(1000, 0)
	p.servers = p.merge([]config.Server{c, a, b}, t0)
	if got := names(p.servers); got != names([]config.Server{a, b, c}) {
		t.Fatalf("first answer: %s", got)
	}
	p.servers = p.merge([]config.Server{a, c}, t0.Add(time.Second))
	if got := names(p.servers); got != names([]config.Server{a, b, c}) {
		t.Errorf("b missing for 1s of 1m: %s", got)
	}
	p.servers = p.merge([]config.Server{a, c}, t0.Add(61*time.Second))
	if got := names(p.servers); got != names([]config.Server{a, c}) {
		t.Errorf("b missing for 1m: %s", got)
	}
	// A server that blinks out and back is not removed, and its clock starts again.
	p.servers = p.merge([]config.Server{a}, t0.Add(62*time.Second))
	p.servers = p.merge([]config.Server{a, c}, t0.Add(100*time.Second))
	p.servers = p.merge([]config.Server{a}, t0.Add(130*time.Second))
	if got := names(p.servers); got != names([]config.Server{a, c}) {
		t.Errorf("c back, then missing for 30s: %s", got)
	}
}

// errorCount is moxi_discovery_errors_total{pool}.
func errorCount(t *testing.T, set *Set, pool string) float64 {
	t.Helper()
	var m dto.Metric
	if err := set.errors.WithLabelValues(pool).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestSet follows a name through a first answer, a server added, one removed after
// remove_after, NXDOMAIN and silence (the list kept, errors counted), and an SRV target
// that comes back with a new address (its ring name kept).
func TestSet(t *testing.T) {
	dns := dnstest.Start(t)
	dns.SetIPs("mc.test", "127.0.0.1")
	dns.SetSRV("srv.test", dnstest.SRV{Target: "pod-0.test", Port: 7000, Weight: 1})
	dns.SetIPs("pod-0.test", "127.0.0.5")
	cfg := &config.Config{Pools: []*config.Pool{
		{Name: "a", Discover: &config.Discover{DNS: "mc.test.", Port: 11211, Interval: 20 * time.Millisecond, RemoveAfter: 200 * time.Millisecond, Resolver: dns.Addr}},
		{Name: "s", Discover: &config.Discover{DNS: "srv.test.", SRV: true, Interval: 20 * time.Millisecond, RemoveAfter: time.Hour, Resolver: dns.Addr}},
		{Name: "plain", Servers: []config.Server{{Addr: "127.0.0.1:1", Weight: 1}}},
	}}
	set := New(cfg, Options{})
	if got := set.Pending(); !slices.Equal(got, []string{"a", "s"}) {
		t.Fatalf("pending before any answer: %v", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var changes sync.Map // pool -> count
	done := make(chan struct{})
	go func() {
		defer close(done)
		set.Run(ctx, func(pool string) {
			n, _ := changes.LoadOrStore(pool, new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
		})
	}()
	defer func() { cancel(); <-done }()
	waitCtx, waitCancel := context.WithTimeout(ctx, 10*time.Second)
	defer waitCancel()
	if err := set.Wait(waitCtx); err != nil {
		t.Fatal(err)
	}
	servers := func(pool string) string {
		s, _ := set.Servers(pool)
		return names(s)
	}
	eventually := func(what string, cond func() bool) {
		t.Helper()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for deadline := time.Now().Add(10 * time.Second); !cond(); <-tick.C {
			if time.Now().After(deadline) {
				t.Fatalf("%s: a: %s; s: %s", what, servers("a"), servers("s"))
			}
		}
	}
	if got := servers("a"); got != "127.0.0.1=127.0.0.1:11211/1" {
		t.Errorf("first answer: %s", got)
	}

	dns.SetIPs("mc.test", "127.0.0.1", "127.0.0.2")
	eventually("a server added", func() bool { return strings.Contains(servers("a"), "127.0.0.2:11211") })
	dns.SetIPs("mc.test", "127.0.0.2")
	removed := time.Now()
	eventually("a server removed", func() bool { return !strings.Contains(servers("a"), "127.0.0.1:11211") })
	if took := time.Since(removed); took < 200*time.Millisecond {
		t.Errorf("removed after %s, before remove_after (200ms)", took)
	}

	before := errorCount(t, set, "a")
	dns.SetIPs("mc.test")
	eventually("NXDOMAIN counted", func() bool { return errorCount(t, set, "a") >= before+2 })
	dns.Silence(true)
	silent := errorCount(t, set, "a")
	eventually("silence counted", func() bool { return errorCount(t, set, "a") >= silent+1 })
	if got := servers("a"); got != "127.0.0.2=127.0.0.2:11211/1" {
		t.Errorf("after NXDOMAIN and silence: %s, want the list kept", got)
	}
	dns.Silence(false)

	dns.SetIPs("pod-0.test", "127.0.0.6")
	eventually("SRV target moved", func() bool { return servers("s") == "pod-0.test=127.0.0.6:7000/1" })
	for _, pool := range []string{"a", "s"} {
		if n, ok := changes.Load(pool); !ok || n.(*atomic.Int64).Load() == 0 {
			t.Errorf("pool %s: no change reported", pool)
		}
	}
	if _, ok := changes.Load("plain"); ok {
		t.Error("a pool without discover reported a change")
	}

	// Fill gives a fresh config the lists; a discover section the Set does not follow is
	// an error.
	fresh := &config.Config{Pools: []*config.Pool{{Name: "a", Discover: cfg.Pools[0].Discover}}}
	if err := set.Fill(fresh); err != nil || len(fresh.Pools[0].Servers) != 1 {
		t.Errorf("Fill: %v, %+v", err, fresh.Pools[0].Servers)
	}
	other := *cfg.Pools[0].Discover
	other.DNS = "else.test."
	if err := set.Fill(&config.Config{Pools: []*config.Pool{{Name: "a", Discover: &other}}}); err == nil {
		t.Error("Fill took a changed discover section")
	}
}
