package servertest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/backend"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// pool.Server.Start's contract, checked on every implementation of the table: done is
// called exactly once, after the turn was dispatched exactly once, with the answers
// pool.DoBatch (pool.Do for a lone request) gives; and nothing of the request — its bytes,
// its answers, its errors, its turn — is touched after done: the check recycles them all
// inside done, as the frontend does, so that -race reports a server that touches them late.

// secondCall is how long a done already called is watched for a second call. A second
// call would come from a second finisher of the same batch (a timeout racing an answer), at
// once; the end of each test checks again, after Close, for later ones.
const secondCall = 50 * time.Millisecond

// silentTimeout is the Timeout env.remote gives a backend over silent servers, which never
// answer; silentWait bounds the wait for a batch sent to one to time out: that, and bound
// more.
const (
	silentTimeout = time.Second
	silentWait    = silentTimeout + bound
)

// startSteps are the batches Start is compared with pool.DoBatch (pool.Do for a lone
// request) on, "{p}" in their keys replaced by a prefix of the caller's, so that the same
// batch runs twice on one server.
var startSteps = []step{
	{name: "sets and gets", batch: true,
		wire: []string{"set {p}a 5 0 1\r\n1\r\n", "get {p}a\r\n", "get {p}b\r\n", "set {p}b 0 0 2\r\nbb\r\n", "get {p}b\r\n",
			"delete {p}a\r\n", "get {p}a\r\n", "add {p}b 0 0 1\r\nx\r\n", "gets {p}b\r\n"},
		want: []string{"OK", "{p}a=1", "{p}b miss", "OK", "{p}b=bb", "OK", "{p}a miss", "NotStored", "{p}b=bb"}},
	{name: "meta requests", batch: true,
		wire: []string{"ms {p}m 1 T0\r\nx\r\n", "mg {p}m v\r\n", "md {p}m\r\n", "mg {p}m v\r\n", "mg {p}none v\r\n"},
		want: []string{"HD", "VA x", "HD", "EN", "EN"}},
	// One retrieval of many keys, answered one response per key; the keys are the ones
	// "sets and gets" left.
	{name: "get of many keys",
		wire: []string{"get {p}b {p}none {p}b {p}a\r\n"},
		want: []string{"{p}b=bb", "{p}none miss", "{p}b=bb", "{p}a miss"}},
}

// prefixed is st with its keys prefixed by p.
func prefixed(st step, p string) step {
	out := step{name: st.name, batch: st.batch}
	for _, w := range st.wire {
		out.wire = append(out.wire, strings.ReplaceAll(w, "{p}", p))
	}
	for _, w := range st.want {
		out.want = append(out.want, strings.ReplaceAll(w, "{p}", p))
	}
	return out
}

// TestStarts runs the Start checks on every implementation of the table, over every kind
// of server it can have.
func TestStarts(t *testing.T) { eachServer(t, impls, testStarts) }

func testStarts(t *testing.T, im impl, k kind) {
	e := &env{t: t, kind: k, arrived: make(chan struct{}, 1)}
	s := im.build(e)
	st := &starts{s: s}
	closed := false
	defer func() {
		if !closed {
			s.Close()
		}
	}()
	var clients []*client
	clientOf := func(t *testing.T) *client { // a client whose late dispatches are checked at the end
		c := newClient(t)
		clients = append(clients, c)
		return c
	}

	switch k {
	case serving:
		for _, sst := range startSteps {
			t.Run(sst.name, func(t *testing.T) {
				c := clientOf(t) // one per path
				do := prefixed(sst, "do-")
				check(t, do, call(t, s, c.request(context.Background()), do), answers)
				start := prefixed(sst, "start-")
				check(t, start, st.start(t, c.request(context.Background()), start), answers)
			})
		}
		t.Run("mixed batch", func(t *testing.T) {
			mixed := step{batch: true, wire: []string{"set x1 0 0 1\r\ny\r\n", "mg x1 v\r\n", "get x1\r\n"}, want: []string{"OK", "VA y", "x1=y"}}
			c := clientOf(t)
			check(t, mixed, st.start(t, c.request(context.Background()), mixed), answers)
		})
		t.Run("cancelled", func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			c := clientOf(t)
			for _, sst := range startSteps {
				sst = prefixed(sst, "cancelled-")
				check(t, sst, st.start(t, c.request(ctx), sst), answersOrFails)
			}
		})
		t.Run("concurrent", func(t *testing.T) { st.concurrent(t, clientOf) })
	case unreachable:
		for _, sst := range startSteps {
			t.Run(sst.name, func(t *testing.T) {
				c, sst := clientOf(t), prefixed(sst, "")
				check(t, sst, st.start(t, c.request(context.Background()), sst), fails)
			})
		}
	case silent:
		t.Run("timeout", func(t *testing.T) { st.timeout(t, e, clientOf) })
		if !im.owns {
			break // a wrapper's Close leaves its server, and the batches on it, to its owner
		}
		t.Run("close while probing", func(t *testing.T) {
			// The timeouts marked a backend dead (FailureLimit), and it probes the silent
			// server: Close must end the probe too, not wait for its Timeout.
			if !s.Up() {
				timer := time.NewTimer(bound)
				defer timer.Stop()
				select {
				case <-e.arrived:
				case <-timer.C:
					t.Fatalf("no probe of the dead server within %v", bound)
				}
			}
			closed = true
			within(t, "Close", func() { _ = s.Close() })
		})
		t.Run("close fails started batches", func(t *testing.T) {
			// A server of its own: two timeouts marked the other one dead (FailureLimit).
			s := im.build(e)
			defer s.Close()
			st := &starts{s: s}
			defer st.noLateDones(t)
			c := clientOf(t)
			e.drain()
			b := st.begin(t, c.request(context.Background()), prefixed(startSteps[0], ""))
			select {
			case <-e.arrived: // on its way: now only an answer, a timeout or Close ends it
			case <-time.After(bound):
				t.Fatalf("the batch did not reach the server within %v", bound)
			}
			within(t, "Close", func() { _ = s.Close() })
			b.finish(t, bound)
			for i, got := range b.got {
				if got != "error" {
					t.Errorf("request %d of a batch running at Close answered %q, from a server that never answers", i, got)
				}
			}
		})
	}

	if !closed {
		closed = true
		within(t, "Close", func() { _ = s.Close() })
	}
	for _, c := range clients {
		c.noLateDispatches(t)
	}
	st.noLateDones(t)
}

// starts makes Start calls on one server and keeps the done of each, to check after
// Close that none was called late.
type starts struct {
	s pool.Server

	mu      sync.Mutex
	started []*doneProbe
}

// doneProbe is the done of one Start call: it counts its calls and signals each.
type doneProbe struct {
	calls atomic.Int32
	ch    chan struct{} // a receive per call, up to two
}

// done never blocks, as pool.Server.Start requires of it.
func (p *doneProbe) done() {
	p.calls.Add(1)
	select {
	case p.ch <- struct{}{}:
	default:
	}
}

// wait waits up to d for done, then secondCall for a second call, which is an error.
func (p *doneProbe) wait(d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-p.ch:
	case <-timer.C:
		return fmt.Errorf("done not called within %v of Start", d)
	}
	return p.noSecond()
}

// noSecond, once done was called, waits secondCall for a second call, which is an error.
func (p *doneProbe) noSecond() error {
	timer := time.NewTimer(secondCall)
	defer timer.Stop()
	select {
	case <-p.ch:
		return errors.New("done called twice")
	case <-timer.C:
	}
	return nil
}

// noLateDones checks, once the server is closed, that every batch started was done once.
func (st *starts) noLateDones(t *testing.T) {
	t.Helper()
	st.mu.Lock()
	defer st.mu.Unlock()
	for i, p := range st.started {
		if n := p.calls.Load(); n != 1 {
			t.Errorf("started batch %d: done called %d times, want exactly once", i, n)
		}
	}
}

// batch is one batch given to Start, with the slices the server fills.
type batch struct {
	t     *testing.T
	r     *request
	reqs  []protocol.Request
	resps []protocol.Response
	errs  []error
	probe *doneProbe

	// Set inside done, which then recycles everything above but probe (recycle).
	got        []string // the answers in short (see answer), "error" where the server did not answer
	failed     []error  // the errors of the requests that failed
	dispatched int32    // the turn's dispatches when done was called
}

// errUnset marks an error the server has not set, errRecycled one recycled inside done;
// unsetMsg and recycledMsg, a response.
var (
	errUnset    = errors.New("not set by the server")
	errRecycled = errors.New("recycled inside done")
)

const (
	unsetMsg    = "not set by the server"
	recycledMsg = "recycled inside done"
)

// newBatch readies the slices Start fills for reqs: a response per request, or per key of
// a lone retrieval of many keys.
func newBatch(t *testing.T, r *request, reqs []protocol.Request) *batch {
	n := len(reqs)
	if n == 1 && reqs[0].Op.IsRetrieval() {
		n = len(reqs[0].Keys)
	}
	b := &batch{t: t, r: r, reqs: reqs, resps: make([]protocol.Response, n), errs: make([]error, len(reqs)), probe: newDoneProbe()}
	for i := range b.resps {
		b.resps[i] = protocol.Response{Msg: unsetMsg}
	}
	for i := range b.errs {
		b.errs[i] = errUnset
	}
	return b
}

func newDoneProbe() *doneProbe { return &doneProbe{ch: make(chan struct{}, 2)} }

// key is the request and key number response i answers.
func (b *batch) key(i int) (req, k int) {
	if len(b.reqs) == 1 {
		return 0, i
	}
	return i, 0
}

// done is the batch's done: it notes the answers and the turn's dispatches, then recycles
// the requests, their answers and errors (see recycle), and tells the probe.
func (b *batch) done() {
	b.dispatched = b.r.dispatches()
	for i := range b.reqs {
		if b.errs[i] == errUnset {
			b.t.Errorf("errs[%d] not set when done was called", i)
		}
	}
	for i := range b.resps {
		j, k := b.key(i)
		req := &b.reqs[j]
		if b.errs[j] != nil {
			b.got, b.failed = append(b.got, "error"), append(b.failed, b.errs[j])
			continue
		}
		if b.resps[i].Msg == unsetMsg {
			b.t.Errorf("resps[%d] not set, with errs[%d] nil, when done was called", i, j)
		}
		if req.Op.IsRetrieval() && string(b.resps[i].Key) != string(req.Keys[k]) {
			b.t.Errorf("resps[%d].Key = %q, want %q: Start gives what Do gives", i, b.resps[i].Key, req.Keys[k])
		}
		b.got = append(b.got, answer(req, k, &b.resps[i]))
	}
	b.recycle()
	b.probe.done()
}

// recycle overwrites the requests' bytes, their answers and errors, as the frontend reuses
// them for the client's next request once done is called; recycled later checks that
// nothing wrote them since.
func (b *batch) recycle() {
	for i := range b.reqs {
		scribble(&b.reqs[i])
	}
	for i := range b.resps {
		b.resps[i] = protocol.Response{Msg: recycledMsg}
	}
	for i := range b.errs {
		b.errs[i] = errRecycled
	}
}

// recycled checks that nothing wrote the batch's answers or errors after done.
func (b *batch) recycled(t *testing.T) {
	t.Helper()
	for i := range b.resps {
		if b.resps[i].Msg != recycledMsg || b.resps[i].Value != nil {
			t.Errorf("resps[%d] written after done: %+v", i, b.resps[i])
		}
	}
	for i := range b.errs {
		if b.errs[i] != errRecycled {
			t.Errorf("errs[%d] written after done: %v", i, b.errs[i])
		}
	}
}

// begin gives s's batch to Start with r.
func (st *starts) begin(t *testing.T, r *request, s step) *batch {
	t.Helper()
	reqs := make([]protocol.Request, len(s.wire))
	for i, w := range s.wire {
		reqs[i] = decode(t, w)
	}
	b := newBatch(t, r, reqs)
	st.mu.Lock()
	st.started = append(st.started, b.probe)
	st.mu.Unlock()
	within(t, "Start", func() { st.s.Start(r.ctx, r.own, b.reqs, b.resps, b.errs, b.done) })
	return b
}

// finish waits up to d for a started batch's done, and checks that its turn was dispatched
// exactly once before it, and that nothing was written after it.
func (b *batch) finish(t *testing.T, d time.Duration) {
	t.Helper()
	if err := b.probe.wait(d); err != nil {
		t.Fatal(err)
	}
	if b.dispatched != 1 {
		t.Errorf("done called with %d dispatches of the turn, want exactly 1 before it", b.dispatched)
	}
	b.r.settled(t)
	b.recycled(t)
}

// start makes s's batch with Start on r, waiting up to bound for its done; it returns the
// answers.
func (st *starts) start(t *testing.T, r *request, s step) []string {
	t.Helper()
	b := st.begin(t, r, s)
	b.finish(t, bound)
	return b.got
}

// timeout: a batch on a server that never answers ends with a timeout error, within the
// server's Timeout, on each path.
func (st *starts) timeout(t *testing.T, e *env, clientOf func(*testing.T) *client) {
	binary, meta := clientOf(t), clientOf(t)
	began := time.Now()
	batches := []*batch{
		st.begin(t, binary.request(context.Background()), prefixed(startSteps[0], "")),
		st.begin(t, meta.request(context.Background()), prefixed(startSteps[1], "")),
	}
	timeouts := 0
	for i, b := range batches {
		b.finish(t, silentWait)
		for j, got := range b.got {
			if got != "error" {
				t.Errorf("batch %d, answer %d: %q from a server that never answers", i, j, got)
			}
		}
		for _, err := range b.failed {
			if errors.Is(err, backend.ErrTimeout) {
				timeouts++
			}
		}
	}
	// The first requests to fail time out; those executed one after the other may then
	// find the server marked dead by them (FailureLimit), and fail at once.
	if timeouts == 0 {
		t.Errorf("no request timed out: %v, %v", batches[0].failed, batches[1].failed)
	}
	// Now, before a server the timeouts marked dead is probed (RetryMin after): what reaches
	// the silent server from here on is the probe.
	e.drain()
	t.Logf("timed out after %v", time.Since(began))
}

// concurrent: many clients start batches at once on one server, each pipelining its
// batches (starting the next once the last was dispatched) and switching paths now and
// then (where a remote server waits for the other path first). Each done comes once, after
// its dispatch, and each answer is the one its client's order makes.
func (st *starts) concurrent(t *testing.T, clientOf func(*testing.T) *client) {
	const clients, batches = 16, 24
	type plan struct {
		c     *client
		reqs  [][]protocol.Request
		wants [][]string
	}
	plans := make([]plan, clients)
	for g := range plans {
		p := &plans[g]
		p.c = clientOf(t)
		for j := range batches {
			key, prev := fmt.Sprintf("c%d-%d", g, j), fmt.Sprintf("c%d-%d", g, j-1)
			value, prevValue := fmt.Sprintf("v%d-%d", g, j), fmt.Sprintf("v%d-%d", g, j-1)
			var wire, want []string
			if j%4 == 3 { // a meta batch: a switch of path, twice
				wire = []string{fmt.Sprintf("ms %s %d T0\r\n%s\r\n", key, len(value), value), "mg " + key + " v\r\n", "mg " + prev + " v\r\n"}
				want = []string{"HD", "VA " + value, "VA " + prevValue}
			} else {
				wire = []string{fmt.Sprintf("set %s 0 0 %d\r\n%s\r\n", key, len(value), value), "get " + key + "\r\n", "get " + prev + "\r\n"}
				want = []string{"OK", key + "=" + value, prev + "=" + prevValue}
				if j == 0 {
					want[2] = prev + " miss"
				}
			}
			reqs := make([]protocol.Request, len(wire))
			for i, w := range wire {
				reqs[i] = decode(t, w)
			}
			p.reqs, p.wants = append(p.reqs, reqs), append(p.wants, want)
		}
	}

	var wg sync.WaitGroup
	for g := range plans {
		wg.Add(1)
		go func() { // exits once its client's batches are answered, or one failed
			defer wg.Done()
			p := &plans[g]
			var pending []*batch
			for j, reqs := range p.reqs {
				r := p.c.request(context.Background())
				b := newBatch(t, r, reqs)
				st.mu.Lock()
				st.started = append(st.started, b.probe)
				st.mu.Unlock()
				st.s.Start(r.ctx, r.own, b.reqs, b.resps, b.errs, b.done)
				if err := waitTurn(r.behind); err != nil { // dispatched: the next batch may start
					t.Errorf("client %d, batch %d: %v", g, j, err)
					return
				}
				pending = append(pending, b)
			}
			for j, b := range pending {
				if err := b.probe.wait(bound); err != nil {
					t.Errorf("client %d, batch %d: %v", g, j, err)
					return
				}
				b.r.returned = b.dispatched
				if b.dispatched != 1 {
					t.Errorf("client %d, batch %d: done called with %d dispatches of the turn, want 1", g, j, b.dispatched)
				}
				if want := p.wants[j]; fmt.Sprint(b.got) != fmt.Sprint(want) {
					t.Errorf("client %d, batch %d: answers %q (%v), want %q", g, j, b.got, b.failed, want)
				}
			}
		}()
	}
	wg.Wait()
}

// waitTurn waits for t within bound, for a goroutine other than the test's.
func waitTurn(t *turn.Turn) error {
	waited := make(chan struct{})
	go func() { // exits when t is ready; one that never is fails the test, and goleak names this
		t.Wait()
		close(waited)
	}()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	select {
	case <-waited:
		return nil
	case <-timer.C:
		return fmt.Errorf("the next request's turn did not come within %v", bound)
	}
}
