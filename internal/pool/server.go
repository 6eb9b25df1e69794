package pool

import (
	"context"

	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// Server is what sits behind one member of a pool: a remote memcached (package backend), an
// embedded in-process store (package memstore), or a wrapper around one of those (a
// migration). It is the one interface between placement and the servers: every
// implementation and every wrapper provides all of it, so that a wrapper cannot hide its
// server's health or counters by forgetting a method.
type Server interface {
	// Do executes req and fills resps: for a retrieval (get, gets, gat, gats) one Response
	// per req.Keys[i] in resps[i], with Key set; for any other command resps[0]. len(resps)
	// is exactly that. A non-nil error means the server did not answer (timeout, connection
	// failure) and resps are undefined; every answer the server gave, including a miss or
	// NOT_STORED, is a Status with a nil error. Safe for concurrent use. req and its bytes
	// are valid only during the call.
	//
	// order is the request's place in its client connection's order (nil: none). Do calls
	// order.Dispatched exactly once — when the request is on its way to the server, or
	// failed before — and sends it on the connection order.Affinity names, minding
	// order.Switch; internal/servertest checks every implementation for it.
	Do(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response) error
	// DoBatch executes reqs, single-key commands (writes, and retrievals of one key), in
	// order, in as few exchanges with the server as it can: resps[i] and errs[i] are what
	// Do would give for reqs[i]. The batch is dispatched (package turn) once, as a whole.
	// This is how a client's pipelined requests travel: one round trip for a run of them,
	// not one each.
	DoBatch(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error)
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

// Starter is a Server that can also send a batch without its caller waiting for the
// answers: the goroutine that reads them finishes the requests, so a request costs no
// goroutine parked on it and no wake-up of one.
type Starter interface {
	// StartBatch is DoBatch that returns at once; reqs may also be one retrieval of many
	// keys, answered as Do answers it (resps one per key). True: the batch was dispatched (package
	// turn), and done is called exactly once — on any goroutine, perhaps before StartBatch
	// returns — when resps and errs are final; done must not block. False: nothing was
	// done and the turn is untouched (no room among the requests in flight, no connection
	// up, the request must wait for an earlier one on another path); the caller uses
	// DoBatch. reqs must stay valid until done. A started batch ends within the server's
	// timeout, whatever becomes of ctx.
	StartBatch(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error, done func()) bool
}

// DoEach is DoBatch one request at a time, for a server with nothing to gain from batches
// (an in-process store) or whose rules are per request (a migration). The batch keeps its
// turn until every request has been executed, so that none is overtaken by the client's
// next request.
func DoEach(ctx context.Context, order *turn.Turn, s Server, reqs []protocol.Request, resps []protocol.Response, errs []error) {
	each, done := order.Defer()
	defer done()
	for i := range reqs {
		errs[i] = s.Do(ctx, each, &reqs[i], resps[i:i+1])
	}
}

// StartNow is StartBatch for a server with no answer to wait for (an in-process store): it
// executes reqs at once with s's DoBatch (a get of many keys with its Do), calls done, and
// reports true. The request path then takes the same started way over s as over a remote
// server.
func StartNow(ctx context.Context, order *turn.Turn, s Server, reqs []protocol.Request, resps []protocol.Response, errs []error, done func()) bool {
	if len(reqs) == 1 && len(reqs[0].Keys) > 1 {
		errs[0] = s.Do(ctx, order, &reqs[0], resps)
	} else {
		s.DoBatch(ctx, order, reqs, resps, errs)
	}
	done()
	return true
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
	Requests      uint64 // requests handed to Do
	Timeouts      uint64 // not answered in time
	Connect       uint64 // no connection (dead, refused, not yet connected)
	IO            uint64 // the connection broke
	Overload      uint64 // no room among the requests in flight
	InFlight      int64  // waiting for answers now
	Connections   int    // configured connections
	ConnectionsUp int    // established now
	Writes        uint64 // system calls that wrote requests
}
