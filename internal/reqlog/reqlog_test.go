package reqlog

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func counter(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

func TestLineIsJSON(t *testing.T) {
	at := time.Date(2026, 12, 3, 10, 0, 0, 123456789, time.UTC)
	for _, r := range []Record{
		{Time: at, Client: "127.0.0.1:5000", User: "alice", Command: "get", Key: []byte("k\"1"), Keys: 3, Pool: "main", Server: "a", Status: "2 of 3 hit", Bytes: 42, Took: 1500 * time.Microsecond},
		{Time: at, Command: "set", Key: []byte{0xff, 0}, Keys: 1, Status: "ok"},
		{Time: at, Command: "version", Status: "ok"},
	} {
		var got map[string]any
		line := AppendLine(nil, &r)
		if line[len(line)-1] != '\n' {
			t.Fatalf("%q: no newline", line)
		}
		if err := json.Unmarshal(line, &got); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		switch {
		case r.Key == nil && (got["key"] != nil || got["key_b64"] != nil):
			t.Errorf("%q: a key for a command without one", line)
		case r.Key != nil && r.Key[0] == 0xff && got["key_b64"] != "/wA=":
			t.Errorf("%q: want key_b64 for a key that is not UTF-8", line)
		case r.Keys == 3 && (got["key"] != "k\"1" || got["keys"] != 3.0 || got["micros"] != 1500.0 || got["time"] != "2026-12-03T10:00:00.123456789Z"):
			t.Errorf("%q", line)
		}
	}
}

func TestFilters(t *testing.T) {
	slow := &Record{Key: []byte("user:1"), Took: 10 * time.Millisecond}
	fast := &Record{Key: []byte("user:2"), Took: time.Millisecond}
	other := &Record{Key: []byte("cfg:1"), Took: 10 * time.Millisecond}
	cases := []struct {
		f                 Filter
		slow, fast, other bool
		fastErr           bool
	}{
		{Filter{}, true, true, true, true},
		{Filter{Slow: 5 * time.Millisecond}, true, false, true, false},
		{Filter{Slow: 5 * time.Millisecond, Prefix: []byte("user:")}, true, false, false, false},
		{Filter{Errors: true}, false, false, false, true},
		{Filter{Sample: 1}, true, true, true, true},
	}
	for i, c := range cases {
		if got := c.f.takes(slow); got != c.slow {
			t.Errorf("case %d: slow taken %v", i, got)
		}
		if got := c.f.takes(fast); got != c.fast {
			t.Errorf("case %d: fast taken %v", i, got)
		}
		if got := c.f.takes(other); got != c.other {
			t.Errorf("case %d: other prefix taken %v", i, got)
		}
		failed := *fast
		failed.Error = true
		if got := c.f.takes(&failed); got != c.fastErr {
			t.Errorf("case %d: fast error taken %v", i, got)
		}
	}
	sampled := 0
	f := Filter{Sample: 0.01}
	for range 100_000 {
		if f.takes(fast) {
			sampled++
		}
	}
	if sampled < 800 || sampled > 1200 {
		t.Errorf("sample 0.01 took %d of 100,000", sampled)
	}
}

// TestWatchersBoundedAndNeverWaitedFor: at most MaxWatchers; a watcher that reads nothing
// loses lines past its buffer, counted, and Offer never waits.
func TestWatchersBoundedAndNeverWaitedFor(t *testing.T) {
	l := New(nil)
	if l.Watching() {
		t.Fatal("watching with no watcher")
	}
	var ws []*Watcher
	for range MaxWatchers {
		w, err := l.Watch(Filter{})
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	if _, err := l.Watch(Filter{}); !errors.Is(err, ErrTooMany) {
		t.Fatalf("watcher %d: %v, want ErrTooMany", MaxWatchers+1, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 3 * watcherLines {
			l.Offer(&Record{Command: "get", Key: []byte("k")})
		}
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Offer waited for watchers that do not read")
	}
	if got, want := counter(l.dropped), float64(MaxWatchers*2*watcherLines); got != want {
		t.Errorf("dropped %v, want %v", got, want)
	}
	if got := len(ws[0].Lines()); got != watcherLines {
		t.Errorf("a watcher holds %d lines, want its bound %d", got, watcherLines)
	}
	for _, w := range ws {
		w.Close()
		w.Close() // twice is harmless
	}
	if l.Watching() {
		t.Fatal("watching after every watcher closed")
	}
	if _, err := l.Watch(Filter{}); err != nil {
		t.Fatalf("a watcher after the others left: %v", err)
	}
}
