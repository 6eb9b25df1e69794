package backend

import (
	"errors"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// TestRestartNoticed: a memcached restarted between two connections is told once, with its
// new start instant, even though no request failed in between; connections made again to
// the same process tell nothing.
func TestRestartNoticed(t *testing.T) {
	mc := memcachedtest.Start(t)
	born := time.Now()
	restarts := make(chan int64, 4)
	s := newServer(t, mc.Addr, Options{Restarted: func(at int64) { restarts <- at }})
	checked := func() int64 {
		s.starts.mu.Lock()
		defer s.starts.mu.Unlock()
		if s.starts.running {
			return 0
		}
		return s.starts.started
	}
	waitFor(t, "the first start instant", func() bool { return checked() != 0 })
	first := checked()

	// Reconnected to the same process: nothing to tell.
	for _, c := range s.conns {
		c.drop(errors.New("test: dropped"))
	}
	waitFor(t, "connections up again and checked", func() bool {
		for _, c := range s.conns {
			if !c.up.Load() {
				return false
			}
		}
		return checked() == first
	})

	// memcached reports whole seconds: a restart is told apart from the same process once
	// the start instants are two seconds apart.
	waitFor(t, "two seconds of the first process", func() bool { return time.Since(born) > 2500*time.Millisecond })
	mc.Restart(t) // moxi marks it dead meanwhile, probes it and connects again
	select {
	case at := <-restarts:
		if at < first+2 {
			t.Errorf("told of a restart at %d, the first process started at %d", at, first)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a restart was not told within 20 s")
	}
	select {
	case at := <-restarts:
		t.Errorf("a restart was told twice (again at %d)", at)
	case <-time.After(200 * time.Millisecond):
	}
}
