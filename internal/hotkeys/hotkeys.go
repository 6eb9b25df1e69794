// Package hotkeys finds the keys that take most of a pool's requests (hot keys), in bounded
// memory and at almost no cost per request: a decayed heavy-hitters sketch over a sample of
// the requests, one Sketch per pool.
package hotkeys

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of the hot_keys settings, the one source of truth for them: Config.WithDefaults
// applies them and config code may show or document them.
const (
	DefaultTop      = 20               // keys reported per pool
	DefaultSample   = 0.01             // fraction of requests counted
	DefaultWindow   = 10 * time.Second // the report covers about this much recent time
	DefaultMinShare = 0.01             // a key is hot from this share of its pool's requests
)

// MaxKeyLen is memcached's limit on a key's length. Longer keys, which memcached refuses
// anyway, are not counted, so that no counter holds more than this many key bytes.
const MaxKeyLen = 250

// MinSampled is how many sampled requests the window must weigh before any share counts:
// below it, every share reads 0 and no key is hot, so that a handful of samples at startup
// (3 of the same key would be a share of 100 %) makes no claim.
const MinSampled = 100

// minHotHits is how many sampled requests a key must weigh in the window to be hot, on top
// of its share: with a small window total and a small min_share, a share threshold alone
// would be met by a key sampled once or twice. Ten hits put the key's count within about
// ±30 % (Poisson), and a key at half of min_share reaches them by chance rarely.
const minHotHits = 10

// Bounds on the number of counters (see counters).
const (
	minCounters = 64
	maxCounters = 4096
)

// renormalizeAfter is how far (in units of tau) the forward-decay landmark may lag the clock
// before the counts are rescaled, long before float64 could overflow (e^32 ≈ 8·10^13).
const renormalizeAfter = 32

// Config is one pool's hot_keys settings. Zero values mean the defaults (WithDefaults).
type Config struct {
	Top      int           // keys Top reports when asked for n ≤ 0; also sizes the sketch
	Sample   float64       // fraction of requests counted, in (0, 1]
	Window   time.Duration // the report covers about this much recent time
	MinShare float64       // a key is hot from this share of the pool's requests, in (0, 1]
}

// Validate reports a setting out of its range. Zero values are valid: they mean the defaults.
func (c Config) Validate() error {
	switch {
	case c.Top < 0:
		return fmt.Errorf("hot_keys: top %d is negative", c.Top)
	case math.IsNaN(c.Sample) || c.Sample < 0 || c.Sample > 1:
		return fmt.Errorf("hot_keys: sample %v is not in (0, 1]", c.Sample)
	case c.Window < 0:
		return fmt.Errorf("hot_keys: window %v is negative", c.Window)
	case math.IsNaN(c.MinShare) || c.MinShare < 0 || c.MinShare > 1:
		return fmt.Errorf("hot_keys: min_share %v is not in (0, 1]", c.MinShare)
	}
	return nil
}

// WithDefaults is c with each zero or out-of-range setting replaced by its default, and Top
// capped at the most counters a sketch holds (it cannot report more keys than it counts).
func (c Config) WithDefaults() Config {
	if c.Top <= 0 {
		c.Top = DefaultTop
	}
	c.Top = min(c.Top, maxCounters)
	if !(c.Sample > 0 && c.Sample <= 1) { // also catches NaN
		c.Sample = DefaultSample
	}
	if c.Window <= 0 {
		c.Window = DefaultWindow
	}
	if !(c.MinShare > 0 && c.MinShare <= 1) {
		c.MinShare = DefaultMinShare
	}
	return c
}

// counters is how many keys a sketch counts at once. Space-Saving overstates a count by at
// most total/counters, and never drops a key whose share is above 1/counters. With at least
// 8/minShare counters the error is at most an eighth of min_share, and a key that is even
// half hot is never dropped; with at least 8·top, the reported keys stand well clear of the
// churning tail of the sketch. The cap bounds memory: at most about 2.5 MB per pool, with
// every counter holding a 250-byte key (the price is accuracy for a min_share under 0.002).
// The defaults make 800 counters, at most about 500 kB.
func counters(top int, minShare float64) int {
	n := max(8*top, int(math.Ceil(8/minShare)))
	return min(max(n, minCounters), maxCounters)
}

// Key is a hot key and its traffic in the window. The JSON names are those of GET /hotkeys.
type Key struct {
	Key               string  `json:"key"`
	RequestsPerSecond float64 `json:"requests_per_s"`
	BytesPerSecond    float64 `json:"bytes_per_s"`
	Share             float64 `json:"share"` // of the pool's requests in the window
}

// Sketch counts one pool's hottest keys. It is safe for concurrent use and starts no
// goroutine: decay is computed when a sampled request or a read needs it. A nil *Sketch is
// valid (hot_keys off): it counts nothing and reports no key.
//
// Algorithm. Space-Saving over a sample of the requests: a fixed number of counters; a
// sampled key that has none takes the smallest one, inheriting its count as the key's
// possible overstatement (err). Counts, errs and the total are weighted by exponential
// decay, which Space-Saving tolerates since scaling every count alike keeps its invariants:
// a request of age a weighs e^(−a/τ) with τ = Window/2, so about 86 % of the weight is in
// the last Window, and the shares and totals change smoothly (halving everything every
// Window/2 would halve the total at once and make the MinSampled floor and the hot set
// flicker). The decay is "forward": a sample at time t adds e^((t−landmark)/τ) and readers
// multiply by e^(−(t−landmark)/τ), so nothing is rescaled per sample, only every 32·τ.
//
// A key's reported hits are count − err, the hits it certainly got since it took its
// counter: keys in the churning tail, whose counts are mostly inherited, read as about 0.
type Sketch struct {
	// Read by every Observe and Hot, written rarely.
	threshold uint64                 // a request is sampled when a 63-bit draw is below it
	sampler   *rand.PCG              // nil: math/rand/v2's per-P source; tests set it to replay a run
	hot       atomic.Pointer[keySet] // the hot keys, replaced whole when they change
	_         [64]byte               // keeps mu's writes off the cache line the fields above are on

	cfg Config
	tau float64 // seconds: the decay's mean age, Window/2
	// rescanEvery is the seconds between re-evaluations of every key's hotness on the
	// sampled path: Window/20, soon enough for cooling, rare enough for O(counters) each.
	rescanEvery float64

	mu        sync.Mutex // guards the fields below
	start     time.Time  // time 0 of seconds(); Import moves it back to the predecessor's
	entries   []counter  // len counters(); entries[:used] hold keys
	used      int
	heap      []int32          // indices into entries, a min-heap by count
	index     map[string]int32 // key → its index in entries
	total     float64          // forward-decayed sampled requests
	landmark  float64          // seconds since start at which a sample weighs 1
	rescanned float64          // seconds since start of the last rescan
	setStale  bool             // some counter's hot flag changed since the set was published
}

// keySet is a set of keys, immutable once published.
type keySet map[string]struct{}

// counter is one key's count. count, err and bytes are forward-decayed weights.
type counter struct {
	key   string  // a copy, made when the key took the counter
	count float64 // the key's hits plus err
	err   float64 // the count it inherited when it took the counter: the most count overstates
	bytes float64 // request and answer bytes since it took the counter
	pos   int32   // its place in Sketch.heap
	hot   bool
}

// hits is the weight of the requests the key certainly had.
func (c *counter) hits() float64 { return c.count - c.err }

// New returns a sketch for cfg (zero settings take their defaults).
func New(cfg Config) *Sketch {
	cfg = cfg.WithDefaults()
	n := counters(cfg.Top, cfg.MinShare)
	s := &Sketch{
		// Sample ≤ 1, so the product is at most 2^63, which a 63-bit draw is always
		// below: Sample = 1 samples every request with no special case.
		threshold:   uint64(cfg.Sample * (1 << 63)),
		cfg:         cfg,
		tau:         cfg.Window.Seconds() / 2,
		rescanEvery: cfg.Window.Seconds() / 20,
		start:       time.Now(),
		entries:     make([]counter, n),
		heap:        make([]int32, 0, n),
		index:       make(map[string]int32, n),
	}
	s.hot.Store(&keySet{})
	return s
}

// Observe counts one request for key, of size bytes (request plus answer). Most calls are
// not sampled and cost one draw from the runtime's per-P random source and a compare: no
// lock, no shared write, no allocation. A sampled call takes the lock; key is copied only
// when it takes a counter.
func (s *Sketch) Observe(key []byte, size int) {
	if s == nil {
		return
	}
	var r uint64
	if s.sampler == nil {
		r = rand.Uint64()
	} else {
		r = s.sampler.Uint64()
	}
	if r>>1 < s.threshold {
		s.observeSampled(key, size)
	}
}

func (s *Sketch) observeSampled(key []byte, size int) {
	if len(key) > MaxKeyLen {
		return
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.seconds(now)
	w := s.weight(t)
	s.total += w
	c := s.count(key, w)
	c.bytes += w * float64(size)
	if !c.hot && s.hotNow(c, s.decay(t)) { // cooling waits for the rescan
		c.hot = true
		s.setStale = true
	}
	if t-s.rescanned >= s.rescanEvery {
		s.rescan(t)
	}
	s.publish()
}

// count adds w to key's counter, giving it one first (the smallest, if all are taken), and
// returns the counter.
func (s *Sketch) count(key []byte, w float64) *counter {
	if i, ok := s.index[string(key)]; ok {
		c := &s.entries[i]
		c.count += w
		s.down(int(c.pos))
		return c
	}
	k := string(key) // the one copy of the key, made as it takes a counter
	if s.used < len(s.entries) {
		i := int32(s.used)
		s.used++
		c := &s.entries[i]
		*c = counter{key: k, count: w, pos: int32(len(s.heap))}
		s.heap = append(s.heap, i)
		s.index[k] = i
		s.up(int(c.pos))
		return c
	}
	i := s.heap[0]
	c := &s.entries[i]
	delete(s.index, c.key)
	// A hot key is not the smallest while even half hot (see counters), but it may have
	// cooled since the last rescan.
	if c.hot {
		s.setStale = true
	}
	*c = counter{key: k, count: c.count + w, err: c.count}
	s.index[k] = i
	s.down(0)
	return c
}

// seconds is now in seconds since the sketch was made.
func (s *Sketch) seconds(now time.Time) float64 { return now.Sub(s.start).Seconds() }

// weight is a sample's forward-decayed weight at t, rescaling every count first when that
// weight would grow past e^renormalizeAfter.
func (s *Sketch) weight(t float64) float64 {
	x := (t - s.landmark) / s.tau
	if x > renormalizeAfter {
		f := math.Exp(-x)
		for i := range s.entries[:s.used] {
			c := &s.entries[i]
			c.count *= f
			c.err *= f
			c.bytes *= f
		}
		s.total *= f
		s.landmark = t
		x = 0
	}
	return math.Exp(x)
}

// decay turns a forward-decayed weight into its value at t. After a long idle spell it
// underflows to 0, and so every key cools.
func (s *Sketch) decay(t float64) float64 { return math.Exp(-(t - s.landmark) / s.tau) }

// exposure is the decayed length of the window at t, in seconds: what a steady rate's
// decayed count is rate·exposure of. τ·(1−e^(−t/τ)) is right from startup, and tends to τ.
func (s *Sketch) exposure(t float64) float64 {
	return max(-s.tau*math.Expm1(-t/s.tau), 1e-3) // 1 ms: samples all at t = 0 are no infinite rate
}

// hotNow reports whether c is hot given d = decay(t). To become hot a key's share must be at
// least MinShare, its hits at least minHotHits and the window's total at least MinSampled;
// a hot key stays hot until it falls below half of one of them (hysteresis: a key whose
// share wavers around MinShare does not flicker).
func (s *Sketch) hotNow(c *counter, d float64) bool {
	f := 1.0
	if c.hot {
		f = 0.5
	}
	hits := c.hits()
	return s.total*d >= f*MinSampled && hits*d >= f*minHotHits && hits >= f*s.cfg.MinShare*s.total
}

// rescan re-evaluates every key's hotness at t: shares fall as the total grows, so keys cool
// without being sampled.
func (s *Sketch) rescan(t float64) {
	d := s.decay(t)
	for i := range s.entries[:s.used] {
		c := &s.entries[i]
		if hot := s.hotNow(c, d); hot != c.hot {
			c.hot = hot
			s.setStale = true
		}
	}
	s.rescanned = t
}

// publish replaces the set Hot reads if a key became hot or cooled.
func (s *Sketch) publish() {
	if !s.setStale {
		return
	}
	set := keySet{}
	for i := range s.entries[:s.used] {
		if c := &s.entries[i]; c.hot {
			set[c.key] = struct{}{}
		}
	}
	s.hot.Store(&set)
	s.setStale = false
}

// Hot reports whether key is hot: its share of the pool's requests reached MinShare and has
// not fallen below half of it since. It takes no lock and allocates nothing, for it is asked
// on every get. The answer is as of the last sampled request or report, so a pool that
// stops getting requests keeps its hot keys until it gets some or is reported on.
func (s *Sketch) Hot(key []byte) bool {
	if s == nil {
		return false
	}
	set := *s.hot.Load()
	if len(set) == 0 {
		return false
	}
	_, ok := set[string(key)]
	return ok
}

// Top returns up to n hot keys (Hot's), hottest first; n ≤ 0 means Config.Top. Colder keys
// are not reported: their counts are mostly the sketch's error and sampling noise. Rates
// are scaled by 1/Sample and divided by the window's decayed length.
func (s *Sketch) Top(n int) []Key {
	if s == nil {
		return nil
	}
	if n <= 0 {
		n = s.cfg.Top
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t, d := s.refreshLocked()
	perSecond := d / (s.cfg.Sample * s.exposure(t))
	var keys []Key
	for i := range s.entries[:s.used] {
		if c := &s.entries[i]; c.hot {
			keys = append(keys, Key{
				Key:               c.key,
				RequestsPerSecond: c.hits() * perSecond,
				BytesPerSecond:    c.bytes * perSecond,
				Share:             c.hits() / s.total,
			})
		}
	}
	slices.SortFunc(keys, func(a, b Key) int {
		return cmp.Or(cmp.Compare(b.Share, a.Share), cmp.Compare(a.Key, b.Key))
	})
	if len(keys) > n {
		keys = keys[:n]
	}
	return keys
}

// refreshLocked brings the hot set up to now for a report: it is the time since the
// sketch began, in seconds, and the decay factor there. The caller holds mu.
func (s *Sketch) refreshLocked() (t, d float64) {
	t = s.seconds(time.Now())
	s.rescan(t)
	s.publish()
	return t, s.decay(t)
}

// HottestShare is the share of the pool's requests in the window of its most requested key,
// hot or not (the moxi_hot_key_share gauge). It is 0 while the window weighs fewer than
// MinSampled samples or that key fewer than minHotHits: such a share would be noise.
func (s *Sketch) HottestShare() float64 {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, d := s.refreshLocked()
	var best float64
	for i := range s.entries[:s.used] {
		best = max(best, s.entries[i].hits())
	}
	if s.total*d < MinSampled || best*d < minHotHits {
		return 0
	}
	return best / s.total
}

// HeldBytes is the memory the sketch holds, in bytes: its counters, its index, the keys and
// the published hot set (map entries estimated). Whatever keys pass, it stays under the
// size of every counter, index entry and hot-set entry holding a MaxKeyLen key.
func (s *Sketch) HeldBytes() int64 {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	held := int64(cap(s.entries))*counterBytes + int64(cap(s.heap))*4
	held += int64(len(s.index)) * indexEntryBytes
	for k := range s.index {
		held += int64(len(k))
	}
	set := *s.hot.Load()
	held += int64(len(set)) * setEntryBytes
	for k := range set { // shared with the counters while they hold the key: counted twice, to be safe
		held += int64(len(k))
	}
	return held
}

// Sizes for HeldBytes: a counter is a string header, three float64 and an int32 and a bool
// (48 bytes); a map entry is estimated at twice its key and value headers, for the table's
// slack and control bytes.
const (
	counterBytes    = 48
	indexEntryBytes = 2 * (16 + 4)
	setEntryBytes   = 2 * 16
)

// maxHeldBytes is the most HeldBytes can be for a sketch of n counters: every counter, index
// entry and hot-set entry holding a key of MaxKeyLen.
func maxHeldBytes(n int) int64 {
	return int64(n) * (counterBytes + 4 + indexEntryBytes + setEntryBytes + 2*MaxKeyLen)
}

// Heap of counters by count: the smallest, the one a new key takes, at heap[0].

func (s *Sketch) less(i, j int) bool {
	return s.entries[s.heap[i]].count < s.entries[s.heap[j]].count
}

func (s *Sketch) swap(i, j int) {
	s.heap[i], s.heap[j] = s.heap[j], s.heap[i]
	s.entries[s.heap[i]].pos = int32(i)
	s.entries[s.heap[j]].pos = int32(j)
}

func (s *Sketch) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !s.less(i, parent) {
			return
		}
		s.swap(i, parent)
		i = parent
	}
}

func (s *Sketch) down(i int) {
	n := len(s.heap)
	for {
		child := 2*i + 1
		if child >= n {
			return
		}
		if right := child + 1; right < n && s.less(right, child) {
			child = right
		}
		if !s.less(child, i) {
			return
		}
		s.swap(i, child)
		i = child
	}
}
