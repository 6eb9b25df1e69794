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

// The pool.Starter contract, checked on every implementation of the table that has it:
// StartBatch that returns true has dispatched the batch's turn exactly once and calls done
// exactly once, with the answers DoBatch gives; one that returns false has done nothing.

// secondCall is how long a done already called is watched for a second call. A second
// call would come from a second finisher of the same batch (a timeout racing an answer), at
// once; the end of each test checks again, after Close, for later ones.
const secondCall = 50 * time.Millisecond

// silentWait bounds the wait for a batch sent to a silent server to time out: the Timeout
// env.remote gives a backend over silent servers (3*bound), and bound more.
const silentWait = 4 * bound

// startSteps are the batches StartBatch is compared with DoBatch (Do for a lone request)
// on, "{p}" in their keys replaced by a prefix of the caller's, so that the same batch runs
// twice on one server. DoBatch runs first, on the same client and path: then the client's
// previous request took the batch's path, and StartBatch need not decline for a switch
// (turn.WouldSwitch).
var startSteps = []step{
	{name: "sets and gets", batch: true,
		wire: []string{"set {p}a 5 0 1\r\n1\r\n", "get {p}a\r\n", "get {p}b\r\n", "set {p}b 0 0 2\r\nbb\r\n", "get {p}b\r\n",
			"delete {p}a\r\n", "get {p}a\r\n", "add {p}b 0 0 1\r\nx\r\n", "gets {p}b\r\n"},
		want: []string{"OK", "{p}a=1", "{p}b miss", "OK", "{p}b=bb", "OK", "{p}a miss", "NotStored", "{p}b=bb"}},
	{name: "meta requests", batch: true,
		wire: []string{"ms {p}m 1 T0\r\nx\r\n", "mg {p}m v\r\n", "md {p}m\r\n", "mg {p}m v\r\n", "mg {p}none v\r\n"},
		want: []string{"HD", "VA x", "HD", "EN", "EN"}},
	// pool.Starter: "reqs may also be one retrieval of many keys, answered as Do answers it".
	// Do is what it is compared with; the keys are the ones "sets and gets" left.
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

// TestStarters runs the Starter checks on every implementation of the table that is a
// pool.Starter (testServer checks the table says which), over every kind of server it can
// have.
func TestStarters(t *testing.T) {
	var starters []impl
	for _, im := range impls {
		if im.starts {
			starters = append(starters, im)
		}
	}
	if len(starters) == 0 {
		t.Fatal("no implementation in the table is a pool.Starter")
	}
	eachServer(t, starters, testStarter)
}

func testStarter(t *testing.T, im impl, k kind) {
	e := &env{t: t, kind: k, arrived: make(chan struct{}, 1)}
	s := im.build(e)
	sr, ok := s.(pool.Starter)
	if !ok {
		s.Close()
		t.Fatalf("%T is not a pool.Starter, though the table says it is", s)
	}
	st := &starts{s: s, sr: sr}
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
				_, got := st.start(t, c.request(context.Background()), start, true)
				check(t, start, got, answers)
			})
		}
		t.Run("mixed batch", func(t *testing.T) {
			mixed := step{batch: true, wire: []string{"set x1 0 0 1\r\ny\r\n", "mg x1 v\r\n", "get x1\r\n"}, want: []string{"OK", "VA y", "x1=y"}}
			c := clientOf(t)
			_, got := st.start(t, c.request(context.Background()), mixed, false)
			check(t, mixed, got, answers)
		})
		t.Run("cancelled", func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			c := clientOf(t)
			for _, sst := range startSteps {
				sst = prefixed(sst, "cancelled-")
				_, got := st.start(t, c.request(ctx), sst, false)
				check(t, sst, got, answersOrFails)
			}
		})
		t.Run("concurrent", func(t *testing.T) { st.concurrent(t, clientOf) })
	case unreachable:
		for _, sst := range startSteps {
			t.Run(sst.name, func(t *testing.T) {
				c, sst := clientOf(t), prefixed(sst, "")
				_, got := st.start(t, c.request(context.Background()), sst, false)
				check(t, sst, got, fails)
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
			st := &starts{s: s, sr: s.(pool.Starter)}
			defer st.noLateDones(t)
			c := clientOf(t)
			b := st.begin(t, c.request(context.Background()), prefixed(startSteps[0], ""), true)
			within(t, "Close", func() { _ = s.Close() })
			b.finish(t, bound)
			for i, err := range b.errs {
				if err == nil {
					t.Errorf("request %d of a batch running at Close succeeded, from a server that never answers", i)
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

// starts makes StartBatch calls on one server and keeps the done of each, to check after
// Close that none was called late.
type starts struct {
	s  pool.Server
	sr pool.Starter

	mu      sync.Mutex
	started []*doneProbe // of calls that returned true: each done once
	refused []*doneProbe // of calls that returned false: never done
}

// doneProbe is the done of one StartBatch call: it counts its calls and signals each.
type doneProbe struct {
	calls atomic.Int32
	ch    chan struct{} // a receive per call, up to two
}

func newDoneProbe() *doneProbe { return &doneProbe{ch: make(chan struct{}, 2)} }

// done never blocks, as pool.Starter requires of it.
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
		return fmt.Errorf("done not called within %v of StartBatch returning true", d)
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

// noLateDones checks, once the server is closed, that every batch started was done once
// and every one declined never.
func (st *starts) noLateDones(t *testing.T) {
	t.Helper()
	st.mu.Lock()
	defer st.mu.Unlock()
	for i, p := range st.started {
		if n := p.calls.Load(); n != 1 {
			t.Errorf("started batch %d: done called %d times, want exactly once", i, n)
		}
	}
	for i, p := range st.refused {
		if n := p.calls.Load(); n != 0 {
			t.Errorf("declined batch %d: done called %d times, want never", i, n)
		}
	}
}

// batch is one batch given to StartBatch, with the slices the server fills.
type batch struct {
	r       *request
	reqs    []protocol.Request
	resps   []protocol.Response
	errs    []error
	probe   *doneProbe
	started bool
}

// errUnset marks an error the server has not set; unsetMsg, a response.
var errUnset = errors.New("not set by the server")

const unsetMsg = "not set by the server"

// newBatch readies the slices StartBatch fills for reqs: a response per request, or per
// key of a lone retrieval of many keys.
func newBatch(r *request, reqs []protocol.Request) *batch {
	n := len(reqs)
	if n == 1 && reqs[0].Op.IsRetrieval() {
		n = len(reqs[0].Keys)
	}
	b := &batch{r: r, reqs: reqs, resps: make([]protocol.Response, n), errs: make([]error, len(reqs))}
	b.reset()
	return b
}

func (b *batch) reset() {
	b.probe = newDoneProbe()
	for i := range b.resps {
		b.resps[i] = protocol.Response{Msg: unsetMsg}
	}
	for i := range b.errs {
		b.errs[i] = errUnset
	}
}

// key is the request and key number response i answers.
func (b *batch) key(i int) (req, k int) {
	if len(b.reqs) == 1 {
		return 0, i
	}
	return i, 0
}

// try calls StartBatch once and keeps its probe; when it declined, it checks that it did
// nothing: no dispatch, no done, no answer.
func (st *starts) try(b *batch) (bool, error) {
	b.started = st.sr.StartBatch(b.r.ctx, b.r.own, b.reqs, b.resps, b.errs, b.probe.done)
	st.mu.Lock()
	if b.started {
		st.started = append(st.started, b.probe)
	} else {
		st.refused = append(st.refused, b.probe)
	}
	st.mu.Unlock()
	if b.started {
		return true, nil
	}
	var errs []error
	if n := b.r.dispatches(); n != 0 {
		errs = append(errs, fmt.Errorf("StartBatch returned false, and dispatched the turn %d times: the turn must be untouched", n))
	}
	if n := b.probe.calls.Load(); n != 0 {
		errs = append(errs, fmt.Errorf("StartBatch returned false, and done was called %d times", n))
	}
	for i := range b.resps {
		if b.resps[i].Msg != unsetMsg {
			errs = append(errs, fmt.Errorf("StartBatch returned false, and set resps[%d]: %+v", i, b.resps[i]))
		}
	}
	for i := range b.errs {
		if b.errs[i] != errUnset {
			errs = append(errs, fmt.Errorf("StartBatch returned false, and set errs[%d]: %v", i, b.errs[i]))
		}
	}
	b.reset() // for another try
	return false, errors.Join(errs...)
}

// begin gives st's batch to StartBatch with r; retry tries again until it takes it, within
// bound (a connection being dialed declines). A batch taken has dispatched r exactly once.
func (st *starts) begin(t *testing.T, r *request, s step, retry bool) *batch {
	t.Helper()
	reqs := make([]protocol.Request, len(s.wire))
	for i, w := range s.wire {
		reqs[i] = decode(t, w)
	}
	b := newBatch(r, reqs)
	attempt := func() bool {
		var err error
		within(t, "StartBatch", func() { _, err = st.try(b) })
		if err != nil {
			t.Error(err)
		}
		return b.started
	}
	if retry {
		eventually(t, "StartBatch taking the batch", attempt)
	} else {
		attempt()
	}
	if b.started {
		r.settled(t)
	}
	return b
}

// finish waits up to d for a started batch's done, and checks every request has its answer
// or error.
func (b *batch) finish(t *testing.T, d time.Duration) {
	t.Helper()
	if err := b.probe.wait(d); err != nil {
		t.Fatal(err)
	}
	b.finished(t)
}

// finished checks, once done was called, that every request has its answer or error.
func (b *batch) finished(t *testing.T) {
	t.Helper()
	for i := range b.reqs {
		if b.errs[i] == errUnset {
			t.Errorf("errs[%d] not set when done was called", i)
		}
	}
}

// answers are the batch's answers in short (see answer), "error" where the server did not
// answer; then the requests' bytes are overwritten, as the client's next request does.
func (b *batch) answers(t *testing.T) []string {
	t.Helper()
	var got []string
	for i := range b.resps {
		j, k := b.key(i)
		req := &b.reqs[j]
		if b.errs[j] != nil {
			got = append(got, "error")
			continue
		}
		if b.resps[i].Msg == unsetMsg {
			t.Errorf("resps[%d] not set, with errs[%d] nil, when done was called", i, j)
		}
		if req.Op.IsRetrieval() && string(b.resps[i].Key) != string(req.Keys[k]) {
			t.Errorf("resps[%d].Key = %q, want %q: StartBatch gives what DoBatch and Do would", i, b.resps[i].Key, req.Keys[k])
		}
		got = append(got, answer(req, k, &b.resps[i]))
	}
	for i := range b.reqs {
		scribble(&b.reqs[i])
	}
	return got
}

// start makes s's batch with StartBatch on r, waiting up to bound for its done, and, when
// StartBatch declines, with DoBatch (Do for a lone request), as its caller would; it
// returns whether StartBatch took it, and the answers.
func (st *starts) start(t *testing.T, r *request, s step, retry bool) (bool, []string) {
	t.Helper()
	b := st.begin(t, r, s, retry)
	if !b.started {
		return false, call(t, st.s, r, s)
	}
	b.finish(t, bound)
	return true, b.answers(t)
}

// timeout: a batch on a server that never answers ends with a timeout error, within the
// server's Timeout, on each path.
func (st *starts) timeout(t *testing.T, e *env, clientOf func(*testing.T) *client) {
	binary, meta := clientOf(t), clientOf(t)
	binarySteps, metaSteps := prefixed(startSteps[0], ""), prefixed(startSteps[1], "")
	// The meta client's first request takes the meta path, so that its StartBatch, next,
	// needs no switch: it is cancelled once it has reached the server.
	ctx, cancel := e.context()
	check(t, metaSteps, call(t, st.s, meta.request(ctx), metaSteps), fails)
	cancel()

	began := time.Now()
	batches := []*batch{
		st.begin(t, binary.request(context.Background()), binarySteps, true),
		st.begin(t, meta.request(context.Background()), metaSteps, true),
	}
	deadline := time.NewTimer(silentWait)
	defer deadline.Stop()
	for _, b := range batches {
		select {
		case <-b.probe.ch:
		case <-deadline.C:
			t.Fatalf("done not called within %v of StartBatch returning true", silentWait)
		}
	}
	// Now, before a server the timeouts marked dead is probed (RetryMin after): what reaches
	// the silent server from here on is the probe.
	e.drain()
	for i, b := range batches {
		if err := b.probe.noSecond(); err != nil {
			t.Error(err)
		}
		b.finished(t)
		for j, err := range b.errs {
			if !errors.Is(err, backend.ErrTimeout) {
				t.Errorf("batch %d, request %d: %v; want a timeout (backend.ErrTimeout)", i, j, err)
			}
		}
	}
	t.Logf("timed out after %v", time.Since(began))
}

// concurrent: many clients start batches at once on one server, each pipelining its
// batches (starting the next once the last was dispatched) and switching paths now and
// then (where StartBatch may decline, and DoBatch sends the batch). Each done comes once,
// and each answer is the one its client's order makes.
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

	var startedN atomic.Int32
	var wg sync.WaitGroup
	for g := range plans {
		wg.Add(1)
		go func() { // exits once its client's batches are answered, or one failed
			defer wg.Done()
			p := &plans[g]
			var pending []*batch
			for j, reqs := range p.reqs {
				r := p.c.request(context.Background())
				b := newBatch(r, reqs)
				ok, err := st.try(b)
				if err != nil {
					t.Errorf("client %d, batch %d: %v", g, j, err)
					return
				}
				if !ok {
					st.s.DoBatch(r.ctx, r.own, b.reqs, b.resps, b.errs)
				} else {
					startedN.Add(1)
				}
				// What settled does, on a goroutine that may not end the test.
				n := r.dispatches()
				r.returned = n
				if n != 1 {
					t.Errorf("client %d, batch %d (started %v): turn.Dispatched called %d times, want once", g, j, ok, n)
				}
				if n == 0 {
					r.own.Release()
				}
				if err := waitTurn(r.behind); err != nil {
					t.Errorf("client %d, batch %d: %v", g, j, err)
					return
				}
				pending = append(pending, b)
			}
			for j, b := range pending {
				if b.started {
					if err := b.probe.wait(bound); err != nil {
						t.Errorf("client %d, batch %d: %v", g, j, err)
						return
					}
				}
				var got []string
				for i := range b.reqs {
					if b.errs[i] != nil {
						got = append(got, fmt.Sprintf("error %v", b.errs[i]))
					} else {
						got = append(got, answer(&b.reqs[i], 0, &b.resps[i]))
					}
				}
				if want := p.wants[j]; fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("client %d, batch %d (started %v): answers %q, want %q", g, j, b.started, got, want)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d of %d batches started, the others declined", startedN.Load(), clients*batches)
	if startedN.Load() == 0 {
		t.Error("StartBatch declined every batch: nothing was checked")
	}
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
