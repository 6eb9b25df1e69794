package frontend_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/frontend"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// The tests of runs a frontend.Starter takes: their answers leave in request order however
// their done calls come, a done never waits for the client, and a run Start declines is
// handled as before.

// doneBound bounds the return of a done: it must not wait for the client, so anything
// near this is a done blocked on a client that does not read.
const doneBound = 2 * time.Second

// maxRuns bounds the runs one test has taken at once.
const maxRuns = 512

// startHandler is a Handler and a Starter. Its Start hands each run it takes to the test,
// which finishes it as a server connection's reader would: fills the answers and calls done
// on a goroutine of its own (finisher). A get of key "name-n" is answered with n bytes made
// from the key (valueOf), a set with STORED.
type startHandler struct {
	decline func(keys []string) bool // runs Start declines; nil: none
	runs    chan *startedRun         // the runs Start took, in the order it took them
	offered atomic.Int64             // requests offered to Start, taken or declined
	handled atomic.Int64             // requests answered by Handle

	mu  sync.Mutex
	all []*startedRun // every run Start took, for finishLeft; guarded by mu
}

var _ frontend.Starter = (*startHandler)(nil)

func newStartHandler(decline func(keys []string) bool) *startHandler {
	return &startHandler{decline: decline, runs: make(chan *startedRun, maxRuns)}
}

// startedRun is a run Start took, until the test finishes it.
type startedRun struct {
	keys  []string // copied: the request's bytes are the connection's
	gets  []bool
	resps []protocol.Response // valid until done
	done  func()
	ended atomic.Bool // finish began: done is called once
}

// finish answers the run and calls its done, unless that was done already.
func (r *startedRun) finish() {
	if r.ended.Swap(true) {
		return
	}
	for i, k := range r.keys {
		r.resps[i] = answerOf(k, r.gets[i])
	}
	r.done()
}

func (h *startHandler) Start(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, done func()) bool {
	r := &startedRun{resps: resps, done: done}
	for i := range reqs {
		k, get := keyOf(&reqs[i])
		r.keys, r.gets = append(r.keys, k), append(r.gets, get)
	}
	defer h.offered.Add(int64(len(reqs))) // once the run is in runs: a test that saw it offered finds it there
	if h.decline != nil && h.decline(r.keys) {
		return false
	}
	order.Dispatched() // on its way, as a pool.Server.Start dispatches: the next run may start
	h.mu.Lock()
	h.all = append(h.all, r)
	h.mu.Unlock()
	h.runs <- r
	return true
}

// finishLeft finishes the runs a failed test left unfinished: the connection's Shutdown
// waits for their answers.
func (h *startHandler) finishLeft() {
	h.mu.Lock()
	all := h.all
	h.mu.Unlock()
	for _, r := range all {
		r.finish()
	}
}

func (h *startHandler) Handle(_ context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response) []protocol.Response {
	h.handled.Add(int64(len(reqs)))
	for i := range reqs {
		k, get := keyOf(&reqs[i])
		resps = append(resps, answerOf(k, get))
	}
	return resps
}

// keyOf is the key of a get or set, and whether it is a get.
func keyOf(req *protocol.Request) (string, bool) {
	if req.Op.IsRetrieval() {
		return string(req.Keys[0]), true
	}
	return string(req.Key), false
}

func answerOf(key string, get bool) protocol.Response {
	if !get {
		return protocol.Response{Status: protocol.StatusOK}
	}
	return protocol.Response{Status: protocol.StatusOK, Value: valueOf(key)}
}

// valueOf is the value of key "name-n": n bytes of the key repeated, so that an answer sent
// for another key, or cut, shows.
func valueOf(key string) []byte {
	n, err := strconv.Atoi(key[strings.LastIndexByte(key, '-')+1:])
	if err != nil {
		panic("key " + key + " has no size")
	}
	return bytes.Repeat([]byte(key+"."), n/(len(key)+1)+1)[:n]
}

// op is one client request: a get of key, or a set of key to its value.
type op struct {
	key string
	set bool
}

func (o op) wire() string {
	if o.set {
		return fmt.Sprintf("set %s 0 0 %d\r\n%s\r\n", o.key, len(valueOf(o.key)), valueOf(o.key))
	}
	return "get " + o.key + "\r\n"
}

func (o op) answer() string {
	if o.set {
		return "STORED\r\n"
	}
	return fmt.Sprintf("VALUE %s 0 %d\r\n%s\r\nEND\r\n", o.key, len(valueOf(o.key)), valueOf(o.key))
}

func wiresOf(ops []op) []byte {
	var b []byte
	for _, o := range ops {
		b = append(b, o.wire()...)
	}
	return b
}

func answersOf(ops []op) []byte {
	var b []byte
	for _, o := range ops {
		b = append(b, o.answer()...)
	}
	return b
}

// startListeners are the two ways a connection writes what must not wait: to the socket
// itself (tryWrite), or, where it cannot (TLS, or the test listener's counting wrapper, which
// hides the *net.TCPConn), all of it on a goroutine of its own.
var startListeners = []struct {
	name  string
	serve func(t *testing.T, s *frontend.Server) string
}{
	{"socket", serveSocket},
	{"wrapped", func(t *testing.T, s *frontend.Server) string { return startServer(t, s).addr }},
}

// serveSocket serves s on a loopback listener whose connections reach it as *net.TCPConn,
// unlike startServer's, until the test ends.
func serveSocket(t *testing.T, s *frontend.Server) string {
	t.Helper()
	ln := listenLoopback(t)
	servePlain(t, s, ln)
	return ln.Addr().String()
}

// connect serves s, whose handler is h, with serve, and dials it. The runs h took and the
// test did not finish (it failed) are finished once the client's connection is closed,
// before the server shuts down, which waits for them.
func connect(t *testing.T, serve func(*testing.T, *frontend.Server) string, s *frontend.Server, h *startHandler) (*client, *finisher) {
	t.Helper()
	addr := serve(t, s)
	t.Cleanup(h.finishLeft)
	return dial(t, addr), newFinisher(t)
}

// finisher calls the done of the runs the test hands it on a goroutine of its own, as a
// server connection's reader does, and tells the test when each returned.
type finisher struct {
	runs     chan *startedRun
	returned chan struct{}
}

func newFinisher(t *testing.T) *finisher {
	f := &finisher{runs: make(chan *startedRun, 1), returned: make(chan struct{}, maxRuns)}
	go func() { // exits when the test ends and closes runs, once the last done returned
		for r := range f.runs {
			r.finish()
			f.returned <- struct{}{}
		}
	}()
	// Before the client's connection is closed: a done blocked on the client returns then.
	t.Cleanup(func() { close(f.runs) })
	return f
}

// finish has r finished and fails the test unless its done returns within doneBound.
func (f *finisher) finish(t *testing.T, r *startedRun) {
	t.Helper()
	timer := time.NewTimer(doneBound)
	defer timer.Stop()
	select {
	case f.runs <- r:
	case <-timer.C:
		t.Fatalf("the finisher still in the last done after %v: a done waited for the client", doneBound)
	}
	select {
	case <-f.returned:
	case <-timer.C:
		t.Fatalf("done of a run of %d requests (%q…) did not return within %v: a done waited for the client",
			len(r.keys), r.keys[0], doneBound)
	}
}

// taken receives the runs Start took until they hold n requests.
func (h *startHandler) taken(t *testing.T, n int) []*startedRun {
	t.Helper()
	runs, ok := h.takenWithin(n, 5*time.Second)
	if !ok {
		got := 0
		for _, r := range runs {
			got += len(r.keys)
		}
		t.Fatalf("Start took %d of %d requests within 5 s (offered %d, handled %d)", got, n, h.offered.Load(), h.handled.Load())
	}
	return runs
}

// takenWithin is taken, but reports false instead of failing when Start has not taken n
// requests within d.
func (h *startHandler) takenWithin(n int, d time.Duration) ([]*startedRun, bool) {
	var runs []*startedRun
	timer := time.NewTimer(d)
	defer timer.Stop()
	for got := 0; got < n; {
		select {
		case r := <-h.runs:
			runs = append(runs, r)
			got += len(r.keys)
		case <-timer.C:
			return runs, false
		}
	}
	return runs, true
}

// expectAll reads want from c within bound, and reports where the answers first differ.
func (c *client) expectAll(want []byte, within time.Duration) {
	c.t.Helper()
	_ = c.nc.SetDeadline(time.Now().Add(within))
	got := c.read(len(want))
	if i := firstDiff(got, want); i >= 0 {
		c.t.Fatalf("answers differ at byte %d of %d: got %q, want %q", i, len(want), around(got, i), around(want, i))
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

func around(b []byte, i int) []byte {
	return b[max(i-40, 0):min(i+40, len(b))]
}

// TestStartedAnswersInOrder: runs started together and finished in reverse order are
// answered in request order.
func TestStartedAnswersInOrder(t *testing.T) {
	for _, l := range startListeners {
		t.Run(l.name, func(t *testing.T) {
			h := newStartHandler(nil)
			c, f := connect(t, l.serve, &frontend.Server{Handler: h}, h)
			var all []op
			var runs []*startedRun
			// Each group is sent once the one before it was taken, so that it is a run of its
			// own (or more): the runs are in flight together.
			for g := range 6 {
				group := []op{{key: fmt.Sprintf("a%d-10", g)}, {key: fmt.Sprintf("s%d-7", g), set: true}, {key: fmt.Sprintf("b%d-%d", g, 300*g*g)}}
				if g == 3 {
					group = append(group, op{key: "big-70000"}) // larger than a write that must not wait takes
				}
				all = append(all, group...)
				c.send(wiresOf(group))
				runs = append(runs, h.taken(t, len(group))...)
			}
			if len(runs) < 6 {
				t.Fatalf("%d runs in flight, want at least 6", len(runs))
			}
			for i := len(runs) - 1; i >= 0; i-- {
				f.finish(t, runs[i])
			}
			c.expectAll(answersOf(all), 10*time.Second)
			if n := h.handled.Load(); n != 0 {
				t.Errorf("%d requests were handled by Handle; Start took every run", n)
			}
		})
	}
}

// TestStartedClientNotReading: while a client does not read, the done of its runs returns
// at once however much is left to write; then the client gets every answer, in order.
func TestStartedClientNotReading(t *testing.T) {
	const requests = 240 // within the connection's window of keys (windowKeys 256)
	shapes := []struct {
		name string
		// oneByOne sends each request once the last was taken: runs of one whose answers
		// are smaller than a write that must not wait takes whole, so that such writes fill
		// the socket. Else all at once: runs of many, each answer a large one.
		oneByOne bool
		size     func(i int) int
	}{
		{"runs of many", false, func(i int) int { return []int{64 << 10, 40 << 10, 1 << 10, 63 << 10}[i%4] }},
		{"runs of one", true, func(int) int { return 40 << 10 }},
	}
	for _, l := range startListeners {
		for _, sh := range shapes {
			t.Run(l.name+"/"+sh.name, func(t *testing.T) {
				h := newStartHandler(nil)
				s := &frontend.Server{Handler: h}
				reg := withMetrics(t, s)
				c, f := connect(t, l.serve, s, h)
				// A small receive buffer: the client's socket fills sooner than the kernel's
				// autotuning would let it.
				if err := c.nc.(*net.TCPConn).SetReadBuffer(16 << 10); err != nil {
					t.Fatal(err)
				}
				var all []op
				for i := range requests {
					all = append(all, op{key: fmt.Sprintf("k%d-%d", i, sh.size(i))})
				}
				backPressure := false
				if sh.oneByOne {
					for i, o := range all {
						c.send([]byte(o.wire()))
						runs, ok := h.takenWithin(1, 2*time.Second)
						if !ok {
							// The reader stopped reading: it found answers due with nobody
							// writing them and writes them itself, waiting for the client, as
							// a client that does not read must make it (back-pressure). The
							// request sent last is taken once the client reads.
							backPressure, all = true, all[:i+1]
							stop := make(chan struct{})
							t.Cleanup(func() { close(stop) })
							go func() { // exits at the test's end
								for {
									select {
									case r := <-h.runs:
										r.finish()
									case <-stop:
										return
									}
								}
							}()
							break
						}
						for _, r := range runs {
							f.finish(t, r)
						}
					}
				} else {
					c.send(wiresOf(all))
					for taken := 0; taken < requests; {
						r := h.taken(t, 1)[0]
						taken += len(r.keys)
						f.finish(t, r)
					}
				}
				// The premise: the client's socket did not take it all, so a done that waited
				// for the client would have shown.
				want := answersOf(all)
				if held := buffered(t, reg); held < 1<<20 && !backPressure {
					t.Fatalf("moxi holds %d bytes of the %d of answers the client has not read: the socket took them, nothing was tested", held, len(want))
				}
				c.expectAll(want, 30*time.Second)
				if n := h.handled.Load(); n != 0 {
					t.Errorf("%d requests were handled by Handle; Start took every run", n)
				}
			})
		}
	}
}

// TestStartDeclined: a run Start declines (a lone request too) is handled by Handle, in
// its place among runs Start took.
func TestStartDeclined(t *testing.T) {
	declined := func(keys []string) bool { return strings.HasPrefix(keys[0], "d") }
	for _, l := range startListeners {
		t.Run(l.name, func(t *testing.T) {
			h := newStartHandler(declined)
			c, f := connect(t, l.serve, &frontend.Server{Handler: h}, h)

			lone := op{key: "dlone-5"} // nothing in flight: answered by the reader itself
			c.send([]byte(lone.wire()))
			c.expectAll([]byte(lone.answer()), 10*time.Second)

			var all []op
			var runs []*startedRun
			var offered, handled int64 = 1, 1
			for g := range 6 {
				prefix := "t" // taken
				if g%2 == 1 {
					prefix = "d"
				}
				group := []op{{key: fmt.Sprintf("%sa%d-10", prefix, g)}, {key: fmt.Sprintf("%ss%d-7", prefix, g), set: true}, {key: fmt.Sprintf("%sb%d-%d", prefix, g, 5000*g)}}
				if g == 5 {
					group = group[:1] // a lone request declined behind runs in flight: Handle
				}
				all = append(all, group...)
				offered += int64(len(group))
				c.send(wiresOf(group))
				if prefix == "d" {
					handled += int64(len(group))
					waitFor(t, "the group offered to Start", func() bool { return h.offered.Load() == offered })
				} else {
					runs = append(runs, h.taken(t, len(group))...)
				}
			}
			for i := len(runs) - 1; i >= 0; i-- {
				f.finish(t, runs[i])
			}
			c.expectAll(answersOf(all), 10*time.Second)
			if n := h.handled.Load(); n != handled {
				t.Errorf("%d requests handled by Handle, want the %d Start declined", n, handled)
			}
		})
	}
}

// TestStaleWriteDeadline: an answer written while the client was slow to read leaves a write
// deadline on the socket; once it has passed, an answer that must not wait (a server
// connection's reader finishing a started run) is still written — a raw write checks the
// deadline first and would fail on it, closing a connection that did nothing wrong.
func TestStaleWriteDeadline(t *testing.T) {
	h := newStartHandler(func(keys []string) bool { return strings.HasPrefix(keys[0], "inline-") })
	defer h.finishLeft()
	s := &frontend.Server{Handler: h, WriteTimeout: 50 * time.Millisecond}
	c, err := net.Dial("tcp", serveSocket(t, s))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	ask := func(o op, finish bool) {
		t.Helper()
		if _, err := c.Write([]byte(o.wire())); err != nil {
			t.Fatal(err)
		}
		if finish {
			go (<-h.runs).finish() // as a server connection's reader would
		}
		want := o.answer()
		got := make([]byte, len(want))
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(r, got); err != nil || string(got) != want {
			t.Fatalf("%s: %q %v, want %q", o.key, got, err, want)
		}
	}
	ask(op{key: "inline-10"}, false)     // written by the reader, within WriteTimeout
	<-time.After(100 * time.Millisecond) // that write's deadline has passed
	ask(op{key: "async-10"}, true)
	ask(op{key: "async-20"}, true)
}
