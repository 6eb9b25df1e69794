package proxy

import "github.com/moxi-proxy/moxi/internal/protocol"

// tally is what answered requests add to the proxy's counters ("stats") and to their pool's
// Prometheus series, counted in plain integers and then added once (counters.add,
// poolMetrics.add): those are shared by every core, so a run of 100 pipelined sets costs
// them an addition each, not 100.
type tally struct {
	counters [numCounters]uint64     // "stats"; get_hits and get_misses are also the pool's
	requests [protocol.NumOps]uint64 // by op
	errors   [numErrorKinds]uint64   // error answers sent (none to a noreply request)
}

// count counts req, answered with resps.
func (n *tally) count(req *protocol.Request, resps []protocol.Response) {
	c := &n.counters
	n.requests[req.Op]++
	for i := range resps {
		s := resps[i].Status
		if s == protocol.StatusTempFailure {
			c[backendErrors]++
		}
		if k := errorKind(s); k != noError && !req.NoReply {
			n.errors[k]++
		}
	}
	// memcached's counters of one key's outcome, from its answer.
	hitOrMiss := func(hit, miss int) {
		switch resps[0].Status {
		case protocol.StatusOK:
			c[hit]++
		case protocol.StatusNotFound:
			c[miss]++
		}
	}
	switch req.Op {
	case protocol.OpGet, protocol.OpGets, protocol.OpGat, protocol.OpGats:
		c[cmdGet] += uint64(len(resps)) // a key each
		if req.Op == protocol.OpGat || req.Op == protocol.OpGats {
			c[cmdTouch] += uint64(len(resps))
		}
		for i := range resps {
			switch resps[i].Status {
			case protocol.StatusOK:
				c[getHits]++
			case protocol.StatusNotFound:
				c[getMisses]++
			}
		}
	case protocol.OpMetaGet:
		c[cmdGet]++
		hitOrMiss(getHits, getMisses)
	case protocol.OpSet, protocol.OpAdd, protocol.OpReplace, protocol.OpAppend, protocol.OpPrepend, protocol.OpMetaSet:
		c[cmdSet]++
	case protocol.OpCas:
		c[cmdSet]++
		switch resps[0].Status {
		case protocol.StatusOK:
			c[casHits]++
		case protocol.StatusNotFound:
			c[casMisses]++
		case protocol.StatusExists:
			c[casBadval]++
		}
	case protocol.OpDelete, protocol.OpMetaDelete:
		hitOrMiss(deleteHits, deleteMisses)
	case protocol.OpIncr:
		hitOrMiss(incrHits, incrMisses)
	case protocol.OpDecr:
		hitOrMiss(decrHits, decrMisses)
	case protocol.OpTouch:
		c[cmdTouch]++
		hitOrMiss(touchHits, touchMisses)
	case protocol.OpFlushAll:
		c[cmdFlush]++
	}
}
