package pool

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// Server is what sits behind one member of a pool: a remote memcached (package backend), an
// embedded in-process store (package memstore), or a wrapper around one of those (a
// migration). It is the one interface between placement and the servers: every
// implementation and every wrapper provides all of it, so that a wrapper cannot hide its
// server's health or counters by forgetting a method.
type Server interface {
	// Start executes reqs and calls done exactly once, on any goroutine — perhaps before
	// Start returns — when resps and errs are final. It never waits: what must wait (room
	// among the requests in flight, a dial, an earlier answer, a lock) waits on a goroutine
	// of the server's, so that a request costs no goroutine parked on it where nothing
	// needs one. done must not block. Safe for concurrent use.
	//
	// reqs is one request, or a run. One request (len(reqs) == 1): for a retrieval (get,
	// gets, gat, gats) one Response per reqs[0].Keys[i] in resps[i], with Key set; for any
	// other command resps[0]. A run: single-key commands (writes, and retrievals of one
	// key), executed in order in as few exchanges with the server as it can, resps[i] and
	// errs[i] for reqs[i] — how a client's pipelined requests travel: one round trip for a
	// run of them, not one each. errs has one entry per request. A non-nil error means the
	// server did not answer (timeout, connection failure) and that request's resps are
	// undefined; every answer the server gave, including a miss or NOT_STORED, is a Status
	// with a nil error. A started call ends within the server's timeout, whatever becomes
	// of ctx.
	//
	// Lifetimes: reqs and their bytes, resps and errs belong to the server from Start until
	// done, and nothing of them (nor of order) is touched after done: the caller may reuse
	// them for another request at once. order is the requests' place in their client
	// connection's order (nil: none); Start calls order.Dispatched exactly once, as a whole,
	// before done — when the requests are on their way to the server, or failed before —
	// and sends them on the connection order.Affinity names, minding order.Switch.
	// internal/servertest checks every implementation for all of it.
	Start(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error, done func())
	// Up reports whether the server is considered alive. Failover moves the keys of a
	// server that is not. Cheap: it is asked on every request.
	Up() bool
	// Info is the server's state and moxi's counters for it, for /servers and the metrics.
	Info() Info
	// Stats are the lines "stats proxy" shows for the server, without the pool:server:
	// prefix.
	Stats() []protocol.Stat
	// Close releases the server's connections and goroutines. Requests still running fail.
	Close() error
}

// Do is Start of one request, waiting for its answer: resps as Start fills them for one
// request, and its error. For a caller that has a goroutine to wait on anyway (a
// background copy, a migration, a retry).
func Do(ctx context.Context, s Server, order *turn.Turn, req *protocol.Request, resps []protocol.Response) error {
	w := getWaiter()
	w.req[0] = *req
	s.Start(ctx, order, w.req[:], resps, w.err[:], w.doneFunc)
	<-w.done
	err := w.err[0]
	putWaiter(w)
	return err
}

// DoBatch is Start of a run, waiting for its answers.
func DoBatch(ctx context.Context, s Server, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error) {
	w := getWaiter()
	s.Start(ctx, order, reqs, resps, errs, w.doneFunc)
	<-w.done
	putWaiter(w)
}

// Part is one server's share of a request or a run that goes to several: what Start takes.
type Part struct {
	Server Server
	Reqs   []protocol.Request
	Resps  []protocol.Response
	Errs   []error
	at     []int // KeysPart: the request's key indexes Resps answer, nil when they are all of them
}

// KeysPart is the part of a retrieval req that asks s for the keys at at (indexes into
// req.Keys, in order), answered into out by Place: req itself when at is every key.
func KeysPart(s Server, req *protocol.Request, at []int, out []protocol.Response) Part {
	p := Part{Server: s, Reqs: []protocol.Request{*req}, Errs: make([]error, 1)}
	if len(at) == len(req.Keys) && at[0] == 0 && at[len(at)-1] == len(at)-1 {
		p.Resps = out
		return p
	}
	keys := make([][]byte, len(at))
	for j, i := range at {
		keys[j] = req.Keys[i]
	}
	p.Reqs[0].Keys, p.Resps, p.at = keys, make([]protocol.Response, len(at)), at
	return p
}

// Place puts a KeysPart's answers in out, where its request's keys are; not when it failed.
func (p *Part) Place(out []protocol.Response) {
	if p.at == nil || p.Errs[0] != nil {
		return
	}
	for j, i := range p.at {
		out[i] = p.Resps[j]
	}
}

// StartParts starts every part at once — a batch per server, no goroutine per server — and
// calls done once all are answered. order is split among them (turn.Turn.Split): the
// connection's next request waits until every part is on its way.
func StartParts(ctx context.Context, order *turn.Turn, parts []Part, done func()) {
	switch len(parts) {
	case 0: // nothing to send (a run of fire-and-forget writes, queued already)
		order.Dispatched()
		done()
		return
	case 1:
		p := &parts[0]
		p.Server.Start(ctx, order, p.Reqs, p.Resps, p.Errs, done)
		return
	}
	order.Split(len(parts))
	g := &gather{done: done}
	g.left.Store(int32(len(parts)))
	for i := range parts {
		p := &parts[i]
		p.Server.Start(ctx, order, p.Reqs, p.Resps, p.Errs, g.partDone)
	}
}

// DoParts is StartParts, waiting for every part's answers.
func DoParts(ctx context.Context, order *turn.Turn, parts []Part) {
	w := getWaiter()
	StartParts(ctx, order, parts, w.doneFunc)
	<-w.done
	putWaiter(w)
}

// gather counts the parts of a StartParts still unanswered.
type gather struct {
	left atomic.Int32
	done func()
}

func (g *gather) partDone() {
	if g.left.Add(-1) == 0 {
		g.done()
	}
}

// waiter is what Do and DoBatch wait on; pooled, as they serve every request of some paths.
type waiter struct {
	req      [1]protocol.Request
	err      [1]error
	done     chan struct{}
	doneFunc func()
}

var waiters sync.Pool // of *waiter

func getWaiter() *waiter {
	if w, ok := waiters.Get().(*waiter); ok {
		return w
	}
	w := &waiter{done: make(chan struct{}, 1)}
	w.doneFunc = func() { w.done <- struct{}{} }
	return w
}

func putWaiter(w *waiter) {
	w.req[0], w.err[0] = protocol.Request{}, nil
	waiters.Put(w)
}

// StartWaiting is the Start of a server whose rules wait for answers (a migration, a
// warm-up, a stand-in write, a replicated read): do, one request's rules as a function
// that waits, runs on a goroutine of its own for each request of reqs in order, then done.
// The run keeps its turn until every request has been executed, so that none is overtaken
// by the client's next request.
func StartWaiting(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error, done func(),
	do func(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response) error) {
	go func() {
		DoEach(ctx, order, reqs, resps, errs, do)
		done()
	}()
}

// Fail is the Start of requests that cannot be sent (no server): their turn given on, every
// one failed with err, then done.
func Fail(order *turn.Turn, errs []error, err error, done func()) {
	order.Dispatched()
	for i := range errs {
		errs[i] = err
	}
	done()
}

// DoEach executes reqs, one request or a run (see Server.Start), with do, one request's
// rules as a function that waits; a run one request after the other, keeping its turn
// until the last has been executed.
func DoEach(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error,
	do func(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response) error) {
	if len(reqs) == 1 {
		errs[0] = do(ctx, order, &reqs[0], resps)
		return
	}
	each, dispatched := order.Defer()
	defer dispatched()
	for i := range reqs {
		errs[i] = do(ctx, each, &reqs[i], resps[i:i+1])
	}
}

// State is a server's state as the admin views show it.
type State string

// The states of a server.
const (
	StateUp        State = "up"
	StateDead      State = "dead"      // marked dead: its requests fail at once, or fail over
	StateMigrating State = "migrating" // its slot's data is being copied from an old server
)

// Info is a server's state and counters.
type Info struct {
	State    State
	Reason   string // why the server is dead, as the admin views show it; "" while it is not
	Counters Counters
}

// Counters are moxi's counts for one server since it was created. An embedded store counts
// requests only; it has no connections and cannot fail to answer.
type Counters struct {
	Requests      uint64 // requests started
	Timeouts      uint64 // not answered in time
	Connect       uint64 // no connection (dead, refused, not yet connected)
	IO            uint64 // the connection broke
	Overload      uint64 // no room among the requests in flight
	InFlight      int64  // waiting for answers now
	Connections   int    // configured connections
	ConnectionsUp int    // established now
	Writes        uint64 // system calls that wrote requests
}
