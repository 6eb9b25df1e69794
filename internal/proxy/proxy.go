// Package proxy is the request path: it routes each request by key prefix to a pool and by
// the pool's placement to a server, splits multi-key gets per server, and gathers the answers
// in request order.
package proxy

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"moxi/internal/pool"
	"moxi/internal/protocol"
)

// Options configure a Proxy. The zero value of each field is usable.
type Options struct {
	Version  string                // answered to "version"
	Registry prometheus.Registerer // where the request metrics go; nil = not exported
	// Connections reports the frontend's current and total client connections for "stats";
	// nil reports zeros.
	Connections func() (current, total uint64)
	// MaxConnections is reported as max_connections in "stats".
	MaxConnections int
}

// Proxy answers client requests from the servers of its current Topology. Safe for
// concurrent use; Swap changes the topology for requests that start afterwards.
type Proxy struct {
	topo    atomic.Pointer[Topology]
	opts    Options
	started time.Time
	stats   counters
	metrics *metrics
}

// New returns a proxy serving topo.
func New(topo *Topology, opts Options) *Proxy {
	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	p := &Proxy{opts: opts, started: time.Now(), metrics: newMetrics(reg)}
	p.topo.Store(topo)
	return p
}

// Swap installs a new topology; requests in flight finish on the one they started with.
func (p *Proxy) Swap(t *Topology) { p.topo.Store(t) }

// Topology is the topology new requests use.
func (p *Proxy) Topology() *Topology { return p.topo.Load() }

// Handle answers req, appending its responses to resps (one per key for a retrieval, else
// one) and returning the extended slice. quit and noop never reach it: they are the
// connection's business.
func (p *Proxy) Handle(ctx context.Context, req *protocol.Request, resps []protocol.Response) []protocol.Response {
	start := time.Now()
	t := p.topo.Load()
	base := len(resps)
	switch {
	case req.Op.IsRetrieval():
		resps = p.retrieve(ctx, t, req, resps)
	case req.Op == protocol.OpFlushAll:
		resps = append(resps, p.flushAll(ctx, t, req))
	case req.Op == protocol.OpVersion:
		// "moxi X", as mcrouter answers "mcrouter X": clients that parse the version see a
		// name, not an old memcached, and take the memcached 1.6 path.
		resps = append(resps, protocol.Response{Value: []byte("moxi " + p.opts.Version)})
	case req.Op == protocol.OpVerbosity:
		resps = append(resps, protocol.Response{}) // moxi logs by --log-level; accepted like memcached
	case req.Op == protocol.OpStats:
		resps = append(resps, p.statsResponse(ctx, t, req))
	default:
		resps = append(resps, protocol.Response{})
		p.do(ctx, t.Locate(req.Key), req, resps[base:])
	}
	p.stats.count(req, resps[base:])
	p.metrics.requests[req.Op].Inc()
	p.metrics.duration[req.Op].Observe(time.Since(start).Seconds())
	return resps
}

// do runs req on m, turning "the server did not answer" into a SERVER_ERROR for each answer.
func (p *Proxy) do(ctx context.Context, m *pool.Member, req *protocol.Request, resps []protocol.Response) {
	if err := m.Server.Do(ctx, req, resps); err != nil {
		failed := protocol.Response{Status: protocol.StatusTempFailure, Msg: fmt.Sprintf("backend %s: %v", m.Name, err)}
		for i := range resps {
			resps[i] = failed
			if req.Op.IsRetrieval() {
				resps[i].Key = req.Keys[i]
			}
		}
	}
}

// retrieve answers a get, gets, gat or gats: one request per server that owns some of the
// keys, run in parallel, the answers put back in the client's key order.
func (p *Proxy) retrieve(ctx context.Context, t *Topology, req *protocol.Request, resps []protocol.Response) []protocol.Response {
	base := len(resps)
	for range req.Keys {
		resps = append(resps, protocol.Response{})
	}
	out := resps[base:]
	if len(req.Keys) == 1 {
		p.do(ctx, t.Locate(req.Keys[0]), req, out)
		return resps
	}

	// Group the keys by owner. A request has few distinct owners, so a linear scan beats a map.
	owners := make([]*pool.Member, len(req.Keys))
	var distinct []*pool.Member
	for i, k := range req.Keys {
		m := t.Locate(k)
		owners[i] = m
		if !containsMember(distinct, m) {
			distinct = append(distinct, m)
		}
	}
	if len(distinct) == 1 {
		p.do(ctx, distinct[0], req, out)
		return resps
	}

	var wg sync.WaitGroup
	for _, m := range distinct {
		var idx []int
		for i, o := range owners {
			if o == m {
				idx = append(idx, i)
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sub := *req
			sub.Keys = make([][]byte, len(idx))
			for j, i := range idx {
				sub.Keys[j] = req.Keys[i]
			}
			subResps := make([]protocol.Response, len(idx))
			p.do(ctx, m, &sub, subResps)
			for j, i := range idx {
				out[i] = subResps[j]
			}
		}()
	}
	wg.Wait()
	return resps
}

func containsMember(ms []*pool.Member, m *pool.Member) bool {
	for _, x := range ms {
		if x == m {
			return true
		}
	}
	return false
}

// flushAll sends flush_all to every server of every pool, in parallel; the answer is OK when
// every server said OK, else the first failure.
func (p *Proxy) flushAll(ctx context.Context, t *Topology, req *protocol.Request) protocol.Response {
	members := t.allMembers()
	answers := make([]protocol.Response, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.do(ctx, m, req, answers[i:i+1])
		}()
	}
	wg.Wait()
	for _, a := range answers {
		if a.Status != protocol.StatusOK {
			return a
		}
	}
	return protocol.Response{}
}

// allMembers is every member of every pool, each server once.
func (t *Topology) allMembers() []*pool.Member {
	var ms []*pool.Member
	for _, pl := range t.Pools {
		for i := range pl.Len() {
			ms = append(ms, pl.Member(i))
		}
	}
	return ms
}
