package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"
)

// newLogger builds the process's logger from --log-level and --log-format. Durations are
// written as Go writes them ("250ms"), in JSON too, where slog would write nanoseconds; and
// a line about one server (an "addr" attribute) that repeats within repeatWindow is
// written once (see repeatFilter).
func newLogger(o *options, w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	hopts := &slog.HandlerOptions{Level: level, ReplaceAttr: durationString}
	var h slog.Handler
	switch o.logFormat {
	case "text":
		h = slog.NewTextHandler(w, hopts)
	case "json":
		h = slog.NewJSONHandler(w, hopts)
	default:
		return nil, fmt.Errorf("--log-format: %q is not text or json", o.logFormat)
	}
	return slog.New(newRepeatFilter(h, repeatWindow, time.Now)), nil
}

// durationString is a ReplaceAttr that writes a time.Duration as its String.
func durationString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// repeatWindow is how long a line about one server stays quiet after it was written.
const repeatWindow = 10 * time.Second

// repeatFilter passes records on to its Handler, except a record that repeats one passed
// less than window ago: same level, message and "addr" attribute. Those are counted,
// and the next one passed says how many were left out ("repeated": n). Records without an
// addr pass always. So a backend that fails (each of its connections breaking, every
// probe, a flapping server) gives one line per window, not one per connection or failure.
type repeatFilter struct {
	slog.Handler
	window time.Duration
	state  *repeats // shared with the filters WithAttrs and WithGroup return
}

type repeats struct {
	now  func() time.Time
	mu   sync.Mutex
	seen map[repeatKey]*repeat // guarded by mu
}

type repeatKey struct {
	level     slog.Level
	msg, addr string
}

type repeat struct {
	passed  time.Time // when the last record passed
	dropped int       // records left out since
}

// maxRepeats bounds the memory of lines seen: past it, entries whose window is over go.
const maxRepeats = 1024

func newRepeatFilter(h slog.Handler, window time.Duration, now func() time.Time) *repeatFilter {
	return &repeatFilter{Handler: h, window: window, state: &repeats{now: now, seen: map[repeatKey]*repeat{}}}
}

func (f *repeatFilter) Handle(ctx context.Context, r slog.Record) error {
	addr := ""
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "addr" {
			addr = a.Value.String()
			return false
		}
		return true
	})
	if addr == "" {
		return f.Handler.Handle(ctx, r)
	}
	dropped, pass := f.state.pass(repeatKey{r.Level, r.Message, addr}, f.window)
	if !pass {
		return nil
	}
	if dropped > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int("repeated", dropped))
	}
	return f.Handler.Handle(ctx, r)
}

// pass reports whether a record of key is written now, and how many were left out before it.
func (s *repeats) pass(key repeatKey, window time.Duration) (dropped int, pass bool) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.seen[key]
	if e != nil && now.Sub(e.passed) < window {
		e.dropped++
		return 0, false
	}
	if e == nil {
		if len(s.seen) >= maxRepeats {
			for k, old := range s.seen {
				if now.Sub(old.passed) >= window {
					delete(s.seen, k)
				}
			}
		}
		e = &repeat{}
		s.seen[key] = e
	}
	dropped, e.passed, e.dropped = e.dropped, now, 0
	return dropped, true
}

func (f *repeatFilter) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &repeatFilter{Handler: f.Handler.WithAttrs(attrs), window: f.window, state: f.state}
}

func (f *repeatFilter) WithGroup(name string) slog.Handler {
	return &repeatFilter{Handler: f.Handler.WithGroup(name), window: f.window, state: f.state}
}
