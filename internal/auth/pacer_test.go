package auth

import (
	"net"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func tcp(ip string, port int) net.Addr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: port} }

func TestPacer(t *testing.T) {
	ms := time.Millisecond
	for _, tt := range []struct {
		name string
		run  func(t *testing.T, p *Pacer)
	}{
		{"an address's failures, whatever the port, as one connection's", func(t *testing.T, p *Pacer) {
			for i := 1; i <= 10; i++ {
				// A new connection (port) every third try, each try once the last is answered.
				wait := p.Fail(tcp("192.0.2.1", 40000+i/3), "nobody", false)
				if wait != Delay(i) {
					t.Errorf("failure %d: wait %v, want %v (Delay(%d))", i, wait, Delay(i), i)
				}
				time.Sleep(wait)
			}
			if w := p.Fail(tcp("192.0.2.2", 1), "nobody", false); w != 0 {
				t.Errorf("another address's first failure waits %v", w)
			}
		}},
		{"parallel failures are answered one after another", func(t *testing.T, p *Pacer) {
			var got []time.Duration
			for i := range 7 {
				got = append(got, p.Fail(tcp("192.0.2.1", 1000+i), "nobody", false))
			}
			want := []time.Duration{0, 0, 0, 100 * ms, 300 * ms, 700 * ms, 1500 * ms}
			for i := range want {
				if got[i] != want[i] {
					t.Errorf("failures at once: waits %v, want %v", got, want)
					break
				}
			}
		}},
		{"no wait past maxWait", func(t *testing.T, p *Pacer) {
			var w time.Duration
			for i := range 100 {
				w = p.Fail(tcp("192.0.2.1", i), "nobody", false)
			}
			if w != maxWait {
				t.Errorf("the 100th failure at once waits %v, want %v", w, maxWait)
			}
		}},
		{"an IPv6 host's /64 is one address", func(t *testing.T, p *Pacer) {
			for i := range 4 {
				p.Fail(tcp("2001:db8:1:2::"+string(rune('a'+i)), 1), "nobody", false)
			}
			if w := p.Fail(tcp("2001:db8:1:2:ffff::1", 1), "nobody", false); w == 0 {
				t.Error("the same /64's fifth failure is not paced")
			}
			if w := p.Fail(tcp("2001:db8:1:3::1", 1), "nobody", false); w != 0 {
				t.Errorf("another /64 waits %v", w)
			}
			for range 4 {
				p.Fail(tcp("::ffff:192.0.2.9", 1), "nobody", false)
			}
			if w := p.Fail(tcp("192.0.2.9", 2), "nobody", false); w == 0 {
				t.Error("an IPv4 address mapped to IPv6 is another address")
			}
		}},
		{"a user's failures from many addresses", func(t *testing.T, p *Pacer) {
			addr := func(i int) net.Addr { return tcp("198.51.100."+strconv.Itoa(i), 1) }
			for i := 1; i <= 3; i++ {
				if w := p.Fail(addr(i), "alice", true); w != 0 {
					t.Errorf("alice's failure %d waits %v", i, w)
				}
			}
			if w := p.Fail(addr(4), "alice", true); w != 100*ms {
				t.Errorf("alice's fourth failure, from a fourth address, waits %v, want 100ms", w)
			}
			if w := p.Fail(addr(5), "no-such-user", false); w != 0 {
				t.Errorf("a name no user has is paced by its address alone: waits %v", w)
			}
			time.Sleep(time.Second)
			p.Succeed("alice")
			if w := p.Fail(addr(6), "alice", true); w != 0 {
				t.Errorf("after alice's login, a failure for alice waits %v", w)
			}
			for range 3 {
				p.Fail(addr(7), "bob", true)
			}
			p.Succeed("bob")
			if w := p.Fail(addr(7), "carol", true); w == 0 {
				t.Error("a login of one's own forgot the address's failures")
			}
		}},
		{"forgotten after a while", func(t *testing.T, p *Pacer) {
			for range 6 {
				p.Fail(tcp("192.0.2.1", 1), "nobody", false)
			}
			time.Sleep(forgetAfter + time.Second)
			if w := p.Fail(tcp("192.0.2.1", 1), "nobody", false); w != 0 {
				t.Errorf("%v after the last failure, the next waits %v", forgetAfter, w)
			}
		}},
		{"every Unix socket client is one address", func(t *testing.T, p *Pacer) {
			for i := range 4 {
				p.Fail(&net.UnixAddr{Name: "@" + strconv.Itoa(i), Net: "unix"}, "nobody", false)
			}
			if w := p.Fail(&net.UnixAddr{Net: "unix"}, "nobody", false); w == 0 {
				t.Error("Unix socket clients are paced apart")
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) { synctest.Test(t, func(t *testing.T) { tt.run(t, NewPacer()) }) })
	}
}

// TestPacerBound: however many addresses and users fail, a Pacer remembers at most
// MaxPaced, names as long as a text login's data costing nothing more, and goes on pacing
// the address failing now.
func TestPacerBound(t *testing.T) {
	p := NewPacer()
	long := strings.Repeat("x", 1<<20)
	guesser := tcp("192.0.2.1", 1)
	for i := range 3 * MaxPaced {
		if i%1000 == 0 {
			p.Fail(guesser, "nobody", false)
		}
		ip := net.IPv4(10, byte(i>>16), byte(i>>8), byte(i))
		name := strconv.Itoa(i)
		if i < 100 {
			name = long + name
		}
		p.Fail(&net.TCPAddr{IP: ip, Port: 1}, name, true)
	}
	if n := p.Len(); n > MaxPaced {
		t.Errorf("remembers %d addresses and users, want at most %d", n, MaxPaced)
	}
	if w := p.Fail(guesser, "nobody", false); w == 0 {
		t.Error("an address failing all along was forgotten among the others")
	}
}

func TestLogLimiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := NewLogLimiter(5)
		shown := 0
		for range 105 {
			if ok, skipped := l.Allow(); ok {
				shown++
				if skipped != 0 {
					t.Errorf("skipped %d before any was", skipped)
				}
			}
		}
		if shown != 5 {
			t.Errorf("%d lines of 105 at once, want 5", shown)
		}
		time.Sleep(200 * time.Millisecond)
		if ok, skipped := l.Allow(); !ok || skipped != 100 {
			t.Errorf("200 ms later: Allow() = %v, %d; want true, 100", ok, skipped)
		}
		if ok, _ := l.Allow(); ok {
			t.Error("a second line within the same 200 ms")
		}
	})
}

func TestLoggedName(t *testing.T) {
	if got := LoggedName("alice"); got != "alice" {
		t.Errorf("LoggedName(alice) = %q", got)
	}
	exact := strings.Repeat("a", MaxLoggedName)
	if got := LoggedName(exact); got != exact {
		t.Errorf("a name of %d bytes cut: %q", MaxLoggedName, got)
	}
	long := strings.Repeat("a", MaxLoggedName-1) + "é" + strings.Repeat("b", 1<<20)
	got := LoggedName(long)
	if want := strings.Repeat("a", MaxLoggedName-1) + "…(" + strconv.Itoa(len(long)) + " bytes)"; got != want {
		t.Errorf("LoggedName(1 MiB) = %q, want %q (cut before the character it would split)", got, want)
	}
}
