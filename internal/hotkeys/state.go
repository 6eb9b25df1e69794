package hotkeys

import (
	"cmp"
	"slices"
	"time"
)

// Handing a sketch's counts to a successor process (an upgrade in place). A successor that
// started empty would find no key hot for up to a window, and the hot cache would send the
// keys it was absorbing back to their servers meanwhile.

// SketchState is what a Sketch knows, as Export gives it and Import takes it. Every weight
// is decayed to the moment of Export and every time is a duration before it, so that no
// instant of one process's clock reaches the other. It holds at most as many counters as
// the sketch had.
type SketchState struct {
	// Age is how long the sketch had been counting: a young sketch's window is shorter,
	// and its rates are divided by that.
	Age      time.Duration  `json:"age_ns"`
	Total    float64        `json:"total"` // the decayed weight of every sampled request
	Counters []CounterState `json:"counters"`
}

// CounterState is one counter of a SketchState, its weights decayed as Total is.
type CounterState struct {
	Key   []byte  `json:"key"`   // bytes, for a key need not be UTF-8, which a JSON string would mangle
	Count float64 `json:"count"` // the key's hits plus Err
	Err   float64 `json:"err"`   // the most Count overstates
	Bytes float64 `json:"bytes"` // request and answer bytes
	Hot   bool    `json:"hot,omitempty"`
}

// Export is what s has counted, as of now, for a successor's Import; a nil sketch has
// counted nothing. It holds s's lock for a copy of every counter.
func (s *Sketch) Export() SketchState {
	if s == nil {
		return SketchState{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t, d := s.refreshLocked() // the hot flags as Hot answers now
	st := SketchState{
		Age:      time.Duration(t * float64(time.Second)),
		Total:    s.total * d,
		Counters: make([]CounterState, s.used),
	}
	for i, c := range s.entries[:s.used] {
		st.Counters[i] = CounterState{Key: []byte(c.key), Count: c.count * d, Err: c.err * d,
			Bytes: c.bytes * d, Hot: c.hot}
	}
	return st
}

// Import replaces what s has counted with st, a predecessor's Export, as if s had counted
// it up to now. The moments between Export and Import are not decayed: an upgrade hands
// its state over in far less than a window, and measuring them would take the two
// processes' clocks. Every key's hotness is judged by s's settings, a key hot in st staying
// hot down to half of min_share, and published before Import returns, so Hot answers from
// the first request. Under other sample or window settings the shares carry over and the
// rates settle within a window.
//
// When st has more counters than s, s keeps the largest: Space-Saving still bounds what a
// key without a counter had by the smallest count kept. A counter whose key is over
// MaxKeyLen, repeats one kept, or whose weights are negative is left out. Import on a nil
// sketch does nothing; st is not modified.
func (s *Sketch) Import(st SketchState) {
	if s == nil {
		return
	}
	byCount := slices.Clone(st.Counters)
	slices.SortFunc(byCount, func(a, b CounterState) int { return cmp.Compare(b.Count, a.Count) })
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.entries)
	clear(s.index)
	s.used, s.heap = 0, s.heap[:0]
	s.start = now.Add(-max(st.Age, 0))
	t := s.seconds(now)
	s.landmark, s.rescanned = t, t // where every weight is as exported
	s.total = max(st.Total, 0)
	for _, cs := range byCount {
		if s.used == len(s.entries) {
			break
		}
		if len(cs.Key) > MaxKeyLen || !(cs.Err >= 0 && cs.Count >= cs.Err && cs.Bytes >= 0) {
			continue
		}
		if _, dup := s.index[string(cs.Key)]; dup {
			continue
		}
		k, i := string(cs.Key), int32(s.used)
		s.entries[i] = counter{key: k, count: cs.Count, err: cs.Err, bytes: cs.Bytes, pos: i, hot: cs.Hot}
		s.heap = append(s.heap, i)
		s.index[k] = i
		s.used++
	}
	for i := len(s.heap)/2 - 1; i >= 0; i-- {
		s.down(i)
	}
	s.rescan(t)
	s.setStale = true // the set published holds what s counted before
	s.publish()
}
