package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestJSONDurations: durations are written as Go writes them, not as nanoseconds.
func TestJSONDurations(t *testing.T) {
	var buf bytes.Buffer
	logger, err := newLogger(&options{logLevel: "info", logFormat: "json"}, &buf)
	if err != nil {
		t.Fatal(err)
	}
	logger.With("grace", 1500*time.Millisecond).WithGroup("g").Info("x", "timeout", 250*time.Millisecond, "n", 3)
	var line struct {
		Grace string
		G     struct {
			Timeout string
			N       int
		}
	}
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("%v: %s", err, buf.String())
	}
	if line.Grace != "1.5s" || line.G.Timeout != "250ms" || line.G.N != 3 {
		t.Errorf("got %s", buf.String())
	}
}

// TestRepeatFilter: a line about one server is written once per window; the next one
// says how many were left out; other servers, messages and lines without addr pass.
func TestRepeatFilter(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	text := slog.NewTextHandler(&buf, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}})
	logger := slog.New(newRepeatFilter(text, 10*time.Second, clock)).With("pool", "main")
	for range 4 {
		logger.Info("backend connection broken", "addr", "h:1", "err", "EOF")
	}
	logger.Info("backend connection broken", "addr", "h:2")
	logger.Warn("backend marked dead", "addr", "h:1")
	logger.Info("no addr")
	logger.Info("no addr")
	advance(10 * time.Second)
	logger.Info("backend connection broken", "addr", "h:1", "err", "EOF")
	logger.Info("backend connection broken", "addr", "h:1", "err", "EOF")
	want := []string{
		`level=INFO msg="backend connection broken" pool=main addr=h:1 err=EOF`,
		`level=INFO msg="backend connection broken" pool=main addr=h:2`,
		`level=WARN msg="backend marked dead" pool=main addr=h:1`,
		`level=INFO msg="no addr" pool=main`,
		`level=INFO msg="no addr" pool=main`,
		`level=INFO msg="backend connection broken" pool=main addr=h:1 err=EOF repeated=3`,
	}
	if got := strings.Split(strings.TrimSpace(buf.String()), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestListenInUse: a taken port names the address and the flag that picks another.
func TestListenInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	var stdout, stderr bytes.Buffer
	code := run([]string{"--listen", addr, "--admin", ""}, &stdout, &stderr)
	want := "listen " + addr + ": address already in use (another moxi or memcached? pick another with --listen)"
	if code != 1 || !strings.Contains(stderr.String(), want) {
		t.Errorf("exit %d, stderr %q: want 1 and %q", code, stderr.String(), want)
	}
}
