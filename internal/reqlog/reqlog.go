// Package reqlog shows live requests to the operators watching them (GET /requests): the
// request path offers each answered request, and every watcher whose filter takes it gets
// it as a JSON line, without ever slowing the request: a watcher that does not keep up
// loses lines, counted.
package reqlog

import (
	"encoding/base64"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// MaxWatchers bounds the watchers at once: each holds a connection of the admin port and a
// buffer of lines.
const MaxWatchers = 4

// watcherLines bounds the lines queued for one watcher (each at most about 1 KiB: a key is
// at most 250 bytes, 344 in base64).
const watcherLines = 1024

// ErrTooMany is Watch's refusal past MaxWatchers.
var ErrTooMany = errors.New("too many watchers of /requests (at most 4)")

// Record is one answered request. Key aliases the request's buffers: Offer encodes it
// before returning.
type Record struct {
	Time    time.Time // when its answer's last byte was written
	Client  string    // the client's address
	User    string    // its login, "" without auth
	Command string
	Key     []byte // the first key; nil for a command without one
	Keys    int    // the keys of a multi-key get; 1 otherwise, 0 without a key
	Pool    string
	Server  string
	// Locate, when set and Pool is "", gives Pool and Server, asked only for a line a
	// watcher takes.
	Locate func(key []byte) (pool, server string)
	Status string
	Error  bool          // an error answer (SERVER_ERROR, CLIENT_ERROR, ERROR and their binary statuses)
	Bytes  int           // request and answer
	Took   time.Duration // first byte read to last byte written
}

// Filter chooses a watcher's requests: those slower than Slow, a Sample of all, every error
// answer (Errors), each only with Prefix when set. Zero Slow, Sample and Errors: every request.
type Filter struct {
	Slow   time.Duration
	Sample float64
	Errors bool
	Prefix []byte
}

func (f *Filter) takes(r *Record) bool {
	if len(f.Prefix) > 0 && (len(r.Key) < len(f.Prefix) || string(r.Key[:len(f.Prefix)]) != string(f.Prefix)) {
		return false
	}
	if f.Slow == 0 && f.Sample == 0 && !f.Errors {
		return true
	}
	return f.Slow > 0 && r.Took > f.Slow || f.Errors && r.Error || f.Sample > 0 && rand.Float64() < f.Sample
}

// Log is the watchers of a process's requests. Safe for concurrent use; the zero value is
// not: use New.
type Log struct {
	mu       sync.Mutex
	watchers atomic.Pointer[[]*Watcher] // copied on write: Offer reads without the lock
	dropped  prometheus.Counter
}

// New returns a Log whose dropped lines are counted in moxi_requests_stream_dropped_total
// (registered in reg when not nil).
func New(reg prometheus.Registerer) *Log {
	l := &Log{dropped: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "moxi_requests_stream_dropped_total",
		Help: "Lines of GET /requests a watcher did not take in time (it reads slower than requests come): dropped, never waited for.",
	})}
	l.watchers.Store(&[]*Watcher{})
	if reg != nil {
		reg.MustRegister(l.dropped)
	}
	return l
}

// Watching reports whether anyone watches: the request path offers nothing otherwise, and
// pays one atomic load.
func (l *Log) Watching() bool { return l != nil && len(*l.watchers.Load()) > 0 }

// Watcher is one GET /requests: its filter and its lines.
type Watcher struct {
	filter Filter
	lines  chan []byte
	log    *Log
	once   sync.Once
}

// Watch adds a watcher with filter f, or refuses past MaxWatchers. Close ends it.
func (l *Log) Watch(f Filter) (*Watcher, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	old := *l.watchers.Load()
	if len(old) >= MaxWatchers {
		return nil, ErrTooMany
	}
	w := &Watcher{filter: f, lines: make(chan []byte, watcherLines), log: l}
	next := append(append(make([]*Watcher, 0, len(old)+1), old...), w)
	l.watchers.Store(&next)
	return w, nil
}

// Lines are the watcher's lines, each a JSON object and a newline.
func (w *Watcher) Lines() <-chan []byte { return w.lines }

// Close removes the watcher; lines queued for it are dropped.
func (w *Watcher) Close() {
	w.once.Do(func() {
		l := w.log
		l.mu.Lock()
		defer l.mu.Unlock()
		old := *l.watchers.Load()
		next := make([]*Watcher, 0, len(old))
		for _, o := range old {
			if o != w {
				next = append(next, o)
			}
		}
		l.watchers.Store(&next)
	})
}

// Offer gives r to every watcher whose filter takes it, never waiting for one.
func (l *Log) Offer(r *Record) {
	if l == nil {
		return
	}
	var line []byte
	for _, w := range *l.watchers.Load() {
		if !w.filter.takes(r) {
			continue
		}
		if len(w.lines) == cap(w.lines) {
			l.dropped.Inc() // full: not even encoded
			continue
		}
		if line == nil {
			if r.Pool == "" && r.Locate != nil && r.Key != nil {
				r.Pool, r.Server = r.Locate(r.Key)
			}
			line = AppendLine(make([]byte, 0, 256), r)
		}
		select {
		case w.lines <- line:
		default:
			l.dropped.Inc()
		}
	}
}

// AppendLine appends r as GET /requests writes it: a JSON object and a newline.
func AppendLine(dst []byte, r *Record) []byte {
	str := func(dst []byte, name, v string) []byte {
		dst = append(append(append(dst, ',', '"'), name...), `":`...)
		return appendJSONString(dst, v)
	}
	dst = append(dst, `{"time":"`...)
	dst = r.Time.UTC().AppendFormat(dst, time.RFC3339Nano)
	dst = append(dst, '"')
	dst = str(dst, "client", r.Client)
	dst = str(dst, "user", r.User)
	dst = str(dst, "command", r.Command)
	switch {
	case r.Key == nil:
	case utf8.Valid(r.Key):
		dst = str(dst, "key", string(r.Key))
	default:
		dst = str(dst, "key_b64", base64.StdEncoding.EncodeToString(r.Key))
	}
	if r.Keys > 1 {
		dst = append(append(dst, `,"keys":`...), strconv.Itoa(r.Keys)...)
	}
	dst = str(dst, "pool", r.Pool)
	dst = str(dst, "server", r.Server)
	dst = str(dst, "status", r.Status)
	dst = append(append(dst, `,"bytes":`...), strconv.Itoa(r.Bytes)...)
	dst = append(append(dst, `,"micros":`...), strconv.FormatInt(r.Took.Microseconds(), 10)...)
	return append(dst, "}\n"...)
}

// appendJSONString appends v as a JSON string (AppendLine sends keys that are not UTF-8 in
// base64; any other invalid byte becomes U+FFFD).
func appendJSONString(dst []byte, v string) []byte {
	if !utf8.ValidString(v) {
		v = strings.ToValidUTF8(v, "\uFFFD") // a user name from the wire, say
	}
	dst = append(dst, '"')
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20 || c == 0x7f:
			dst = append(dst, `\u00`...)
			dst = append(dst, hex[c>>4], hex[c&0xf])
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

const hex = "0123456789abcdef"
