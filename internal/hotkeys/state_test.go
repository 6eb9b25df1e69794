package hotkeys

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestStateRoundTrip: a state through JSON into a fresh sketch makes the same keys hot at
// once, before any report refreshes it, and the same report, a key that is not UTF-8
// included.
func TestStateRoundTrip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := Config{Sample: 1, Window: 10 * time.Second, MinShare: 0.01}
		s := New(cfg)
		shares := map[string]int{"\xff\x00bin": 10, "b": 5, "c": 2} // per 100 requests
		bg := 0
		for range 2 * cfg.Window / (50 * time.Millisecond) {
			for k, n := range shares {
				observeKey(s, k, n, 100)
			}
			for range 83 {
				bg = (bg + 1) % 50_000
				s.Observe(fmt.Appendf(nil, "bg:%d", bg), 100)
			}
			time.Sleep(50 * time.Millisecond)
		}
		st := s.Export()
		if len(st.Counters) > len(s.entries) {
			t.Fatalf("the state holds %d counters, the sketch %d", len(st.Counters), len(s.entries))
		}
		data, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		var back SketchState
		if err := json.Unmarshal(data, &back); err != nil {
			t.Fatal(err)
		}
		r := New(cfg)
		r.Import(back)
		for k := range shares {
			if !r.Hot([]byte(k)) {
				t.Errorf("Hot(%q) = false after the import", k)
			}
		}
		for _, c := range st.Counters {
			if got, want := r.Hot(c.Key), s.Hot(c.Key); got != want {
				t.Errorf("Hot(%q) = %v after the import, %v before", c.Key, got, want)
			}
		}
		sameTop(t, r.Top(0), s.Top(0))
		if got, want := r.HottestShare(), s.HottestShare(); !near(got, want) {
			t.Errorf("HottestShare = %v after the import, %v before", got, want)
		}
	})
}

// TestStateImportSmaller: a state of more counters than the sketch keeps the largest counts,
// leaves out what is invalid, replaces what the sketch had counted, judges hotness by the
// sketch's settings and leaves a heap whose smallest counter is the one a new key takes.
func TestStateImportSmaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var st SketchState
		for i := range 1000 { // k0 counted 1 … k999 counted 1000
			st.Counters = append(st.Counters, CounterState{Key: fmt.Appendf(nil, "k%d", i),
				Count: float64(i + 1), Bytes: 100 * float64(i+1), Hot: i == 999})
			st.Total += float64(i + 1)
		}
		st.Counters = append(st.Counters,
			CounterState{Key: []byte("huge"), Count: 100_000},
			CounterState{Key: []byte("huge"), Count: 50_000},                        // repeated
			CounterState{Key: []byte(strings.Repeat("x", MaxKeyLen+1)), Count: 1e9}, // too long
			CounterState{Key: []byte("negative"), Count: 1e9, Err: -1},
		)
		st.Total += 100_000
		rand.New(rand.NewPCG(1, 2)).Shuffle(len(st.Counters), func(i, j int) {
			st.Counters[i], st.Counters[j] = st.Counters[j], st.Counters[i]
		})

		s := New(Config{Sample: 1})
		observeKey(s, "before", 200, 10)
		if !s.Hot([]byte("before")) {
			t.Fatal("a key alone for 200 samples is not hot")
		}
		s.Import(st)
		// At min_share 1 % of 600,500: huge (17 %) turns hot; k999 (0.17 %) cools, hot
		// in the state or not.
		for k, want := range map[string]bool{"huge": true, "k999": false, "before": false, "negative": false} {
			if s.Hot([]byte(k)) != want {
				t.Errorf("Hot(%s) = %v after the import, want %v", k, !want, want)
			}
		}
		kept := map[string]float64{}
		for _, c := range s.Export().Counters {
			kept[string(c.Key)] = c.Count
		}
		n := len(s.entries) // 800: huge and k201 … k999
		if len(kept) != n || kept["huge"] != 100_000 || len(s.index) != n {
			t.Fatalf("kept %d counters (huge %v), %d indexed, want %d (huge 100000)",
				len(kept), kept["huge"], len(s.index), n)
		}
		for i := 1000 - (n - 1); i < 1000; i++ {
			if kept[fmt.Sprint("k", i)] != float64(i+1) {
				t.Fatalf("k%d, among the largest counts, was not kept as %d (kept as %v)", i, i+1, kept[fmt.Sprint("k", i)])
			}
		}

		s.Observe([]byte("new"), 10)
		if c := counterOf(s.Export(), "new"); c.Err != float64(1000-(n-1)+1) {
			t.Errorf("a new key took a counter of %v, want the smallest, %d", c.Err, 1000-(n-1)+1)
		}
	})
}

// TestStateDecay: a state is decayed to the moment of Export, and a sketch that imports it
// goes on as the exporter does: the same report a while later, and a key no longer
// requested cools in either.
func TestStateDecay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const window = 10 * time.Second
		cfg := Config{Sample: 1, Window: window, MinShare: 0.01}
		p := &traffic{s: New(cfg)}
		s := p.s
		p.run(2*window, 2000, 0.1, nil)
		fresh := s.Export()
		time.Sleep(window / 2) // one tau
		st := s.Export()
		if !near(st.Age.Seconds(), (fresh.Age + window/2).Seconds()) {
			t.Errorf("ages %v and %v, exported %v apart", fresh.Age, st.Age, window/2)
		}
		if !near(st.Total, fresh.Total/math.E) {
			t.Errorf("total %v after a tau idle, %v before: want it divided by e", st.Total, fresh.Total)
		}
		if c, was := counterOf(st, "hot"), counterOf(fresh, "hot"); !c.Hot || !near(c.Count, was.Count/math.E) ||
			!near(c.Err, was.Err/math.E) || !near(c.Bytes, was.Bytes/math.E) {
			t.Errorf("counter %+v after a tau idle, %+v before", c, was)
		}

		r := New(cfg)
		r.Import(st)
		time.Sleep(window / 4)
		sameTop(t, r.Top(0), s.Top(0))
		if len(r.Top(0)) != 1 {
			t.Errorf("Top = %+v, want hot alone", r.Top(0))
		}

		time.Sleep(3 * window)
		if len(s.Top(0)) != 0 || len(r.Top(0)) != 0 { // Top refreshes what Hot answers
			t.Fatalf("a key idle for 3 windows is hot: in the exporter %v, the importer %v",
				s.Top(0), r.Top(0))
		}
		cold := New(cfg)
		cold.Import(s.Export())
		if cold.Hot([]byte("hot")) {
			t.Error("a key idle for 3 windows is hot in a sketch importing it")
		}
	})
}

// TestStateKeepsHot: a key hot before the import stays hot down to half of min_share; the
// same counts, not hot in the state, are judged anew by the importer's settings.
func TestStateKeepsHot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const window = 10 * time.Second
		cfg := Config{Sample: 1, Window: window, MinShare: 0.01}
		p := &traffic{s: New(cfg)}
		p.run(2*window, 2000, 0.012, nil)
		p.run(3*window, 2000, 0.007, nil) // between min_share/2 and min_share
		st := p.s.Export()
		if !p.s.Hot([]byte("hot")) {
			t.Fatalf("a key at 0.7 %%, once hot, is not hot (Top %+v)", p.s.Top(0))
		}
		notHot := st
		notHot.Counters = nil
		for _, c := range st.Counters {
			c.Hot = false
			notHot.Counters = append(notHot.Counters, c)
		}
		for _, tc := range []struct {
			name     string
			minShare float64
			st       SketchState
			want     bool
		}{
			{"hot before", 0.01, st, true},
			{"not hot before", 0.01, notHot, false},
			{"not hot before, min_share 0.5 %", 0.005, notHot, true},
			{"hot before, min_share 2 %", 0.02, st, false},
		} {
			r := New(Config{Sample: 1, Window: window, MinShare: tc.minShare})
			r.Import(tc.st)
			if r.Hot([]byte("hot")) != tc.want {
				t.Errorf("%s: Hot = %v, want %v", tc.name, !tc.want, tc.want)
			}
		}
	})
}

func TestStateNilSketch(t *testing.T) {
	var s *Sketch
	if st := s.Export(); st.Total != 0 || len(st.Counters) != 0 {
		t.Errorf("a nil sketch exports %+v", st)
	}
	s.Import(New(Config{}).Export())
}

// sameTop fails unless got and want list the same keys in the same order, at the same
// shares and rates.
func sameTop(t *testing.T, got, want []Key) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("Top = %+v, want %+v", got, want)
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Key != w.Key || !near(g.Share, w.Share) || !near(g.RequestsPerSecond, w.RequestsPerSecond) ||
			!near(g.BytesPerSecond, w.BytesPerSecond) {
			t.Errorf("Top[%d] = %+v, want %+v", i, g, w)
		}
	}
}

// counterOf is key's counter in st, or a zero one.
func counterOf(st SketchState, key string) CounterState {
	for _, c := range st.Counters {
		if string(c.Key) == key {
			return c
		}
	}
	return CounterState{}
}

// near reports whether a and b agree but for floating-point rounding.
func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(math.Abs(a), math.Abs(b)) }
