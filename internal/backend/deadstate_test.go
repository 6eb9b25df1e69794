package backend

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

// pipeDial is a Server's dial inside a synctest bubble. While up it connects, over a pipe,
// to a fake server that answers everything; while down it fails, noting when: once the
// Server is dead only its prober dials, so those are its probes.
type pipeDial struct {
	f *fakeServer

	mu    sync.Mutex
	down  bool
	fails []time.Time // the dials that failed since down was last set
	fars  []net.Conn  // the fake server's ends of the pipes, for hangUp
}

// newPipeDial returns a pipeDial whose fake server is waited for when t ends, after the
// Server (made later, so closed first) has closed its ends of the pipes.
func newPipeDial(t *testing.T, down bool) *pipeDial {
	answer := func(int, *protocol.Request) (*protocol.Response, time.Duration, bool) {
		return &protocol.Response{}, 0, false
	}
	d := &pipeDial{f: &fakeServer{handle: answer}, down: down}
	t.Cleanup(d.f.wg.Wait)
	return d
}

func (d *pipeDial) dial(context.Context) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down {
		d.fails = append(d.fails, time.Now())
		return nil, errors.New("connection refused")
	}
	near, far := net.Pipe()
	d.fars = append(d.fars, far)
	d.f.wg.Add(1)
	go d.f.serve(far)
	return near, nil
}

// setDown makes the dials from now on fail (or connect), and forgets the failed ones so far.
func (d *pipeDial) setDown(down bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.down, d.fails = down, nil
}

// hangUp closes the fake server's end of every pipe made so far: the Server's connections
// break.
func (d *pipeDial) hangUp() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.fars {
		c.Close()
	}
	d.fars = nil
}

// failedAfter is when each failed dial was made, counted from start.
func (d *pipeDial) failedAfter(start time.Time) []time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []time.Duration
	for _, at := range d.fails {
		out = append(out, at.Sub(start))
	}
	return out
}

// deadServer is a Server that cannot be reached since it was made (now), probed after
// 1s, 2s, 4s..., up to a minute.
func deadServer(t *testing.T) (*Server, *pipeDial) {
	d := newPipeDial(t, true)
	return newServer(t, "memcached:11211", Options{Connections: 1, RetryMin: time.Second, RetryMax: time.Minute, dial: d.dial}), d
}

// exported is the record of a server dead for 10s, whose probes at 1s, 3s and 7s failed:
// the interval is 8s, the next probe due at 15s.
var exported = DeadState{Reason: "connection refused", DeadFor: 10 * time.Second, Backoff: 8 * time.Second, ProbeIn: 5 * time.Second}

// TestDeadExportsBackoff: a server that failed several probes exports how long it has
// been dead, how far its backoff has grown and when its next probe is due; nothing once
// a probe finds it back.
func TestDeadExportsBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, d := deadServer(t)
		start := time.Now()
		time.Sleep(exported.DeadFor)
		if got := d.failedAfter(start); !slices.Equal(got, []time.Duration{0, time.Second, 3 * time.Second, 7 * time.Second}) {
			t.Fatalf("dials failed at %v, want the first dial and probes at 1s, 3s, 7s", got)
		}
		if st, ok := s.Dead(); !ok || st != exported {
			t.Fatalf("Dead() = %+v, %v; want %+v, true", st, ok, exported)
		}
		d.setDown(false)
		time.Sleep(exported.ProbeIn + time.Second) // past the probe, not at its instant
		synctest.Wait()
		if st, ok := s.Dead(); ok || !s.Up() {
			t.Errorf("after a probe that was answered: Dead() = %+v, true; Up() = %v", st, s.Up())
		}
	})
}

// TestMarkDeadContinuesBackoff: a new Server for the same address, given the record a dead
// one exported, is dead at once, since as long as the record says, and probes when the
// record's next probe was due, then at intervals that go on doubling from the record's,
// within its own dead_backoff and dead_backoff_max.
func TestMarkDeadContinuesBackoff(t *testing.T) {
	const watch = 27 * time.Second // between probes, in every case
	tests := []struct {
		name             string
		retryMin, max    time.Duration // the successor's dead_backoff and dead_backoff_max
		deadAlready      bool          // its own first dial failed before the record came
		record           func(DeadState) DeadState
		backoff, probeIn time.Duration // as Dead reports right after MarkDead
		probes           []time.Duration
	}{
		{name: "up when marked", retryMin: time.Second, max: time.Minute,
			backoff: 8 * time.Second, probeIn: 5 * time.Second, probes: []time.Duration{5 * time.Second, 21 * time.Second}},
		{name: "dead already", retryMin: time.Second, max: time.Minute, deadAlready: true,
			backoff: 8 * time.Second, probeIn: 5 * time.Second, probes: []time.Duration{5 * time.Second, 21 * time.Second}},
		{name: "lower dead_backoff_max", retryMin: time.Second, max: 4 * time.Second,
			backoff: 4 * time.Second, probeIn: 4 * time.Second, probes: []time.Duration{4 * time.Second, 8 * time.Second, 12 * time.Second, 16 * time.Second, 20 * time.Second, 24 * time.Second}},
		{name: "higher dead_backoff", retryMin: 10 * time.Second, max: time.Minute,
			backoff: 10 * time.Second, probeIn: 5 * time.Second, probes: []time.Duration{5 * time.Second, 25 * time.Second}},
		{name: "zero backoff and wait", retryMin: time.Second, max: time.Minute,
			record:  func(st DeadState) DeadState { st.Backoff, st.ProbeIn = 0, 0; return st },
			backoff: time.Second, probeIn: 0, probes: []time.Duration{0, 2 * time.Second, 6 * time.Second, 14 * time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				old, _ := deadServer(t)
				time.Sleep(exported.DeadFor)
				st, ok := old.Dead()
				if !ok {
					t.Fatal("the old server is not dead")
				}
				old.Close()
				if tt.record != nil {
					st = tt.record(st)
				}

				d := newPipeDial(t, tt.deadAlready)
				s := newServer(t, "memcached:11211", Options{Connections: 1, RetryMin: tt.retryMin, RetryMax: tt.max, dial: d.dial})
				synctest.Wait()
				if s.Up() == tt.deadAlready {
					t.Fatalf("before MarkDead: up %v, want %v", s.Up(), !tt.deadAlready)
				}
				d.setDown(true) // from here on, only probes dial
				start := time.Now()
				s.MarkDead(st)
				if s.Up() {
					t.Fatal("up right after MarkDead")
				}
				want := DeadState{Reason: st.Reason, DeadFor: st.DeadFor, Backoff: tt.backoff, ProbeIn: tt.probeIn}
				if got, ok := s.Dead(); !ok || got != want {
					t.Errorf("Dead() = %+v, %v; want %+v, true", got, ok, want)
				}
				if _, since := s.State(); !since.Equal(start.Add(-st.DeadFor)) {
					t.Errorf("dead since %v before MarkDead, want %v", start.Sub(since), st.DeadFor)
				}
				time.Sleep(watch)
				if got := d.failedAfter(start); !slices.Equal(got, tt.probes) {
					t.Errorf("probed at %v after MarkDead, want %v", got, tt.probes)
				}
			})
		})
	}
}

// TestDeadOfUpServer: a server that is up exports nothing, and is left as it was.
func TestDeadOfUpServer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := newPipeDial(t, false)
		s := newServer(t, "memcached:11211", Options{Connections: 1, dial: d.dial})
		synctest.Wait()
		_, since := s.State()
		if st, ok := s.Dead(); ok {
			t.Errorf("Dead() = %+v, true for a server that is up", st)
		}
		if up, now := s.State(); !up || !now.Equal(since) {
			t.Errorf("after Dead(): up %v since %v, want up since %v", up, now, since)
		}
	})
}

// TestDeadStateJSON: the record survives the handover's JSON unchanged, in the encoding a
// successor of another version reads.
func TestDeadStateJSON(t *testing.T) {
	const want = `{"reason":"connection refused","dead_for":10000000000,"backoff":8000000000,"probe_in":5000000000}`
	b, err := json.Marshal(exported)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != want {
		t.Errorf("encoded as %s, want %s", b, want)
	}
	var got DeadState
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got != exported {
		t.Errorf("round trip: %+v, want %+v", got, exported)
	}
}
