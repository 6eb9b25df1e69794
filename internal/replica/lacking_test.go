package replica_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"github.com/moxi-proxy/moxi/internal/turn"
	"strings"
	"testing"

	"github.com/moxi-proxy/moxi/internal/memstore"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/replica"
	"github.com/moxi-proxy/moxi/internal/servertest"
)

// decodeText reads one request as the frontend's text codec does.
func decodeText(t *testing.T, wire string) protocol.Request {
	t.Helper()
	var req protocol.Request
	r := protocol.NewTextReader(bufio.NewReader(strings.NewReader(wire)), protocol.DefaultLimits())
	if err := r.Read(&req); err != nil {
		t.Fatalf("%q: %v", wire, err)
	}
	return req
}

// outcome is what a client can compare of an answer: its text (binary: status and value),
// without cas uniques, which each server numbers its own way.
func outcome(req *protocol.Request, resp protocol.Response) string {
	resp.Cas = 0
	if req.Binary {
		return fmt.Sprintf("status %d %q", resp.Status.BinaryStatus(), resp.Value)
	}
	if req.Op.IsMeta() {
		resp.Meta.Flags = nil // holds the cas when c was asked
	}
	return string(protocol.AppendTextResponse(nil, req, []protocol.Response{resp}))
}

// TestReplicaLackingDecider: a key's first replica lost the key (restarted empty) while the
// second holds it. Every conditional command is answered as one memcached that never lost
// it answers (a store without replicas here), in every protocol, and afterwards both
// replicas hold what that store holds. With the key on no replica, the answers are a
// miss's, and a binary incr with an initial value creates it.
func TestReplicaLackingDecider(t *testing.T) {
	binIncr := protocol.Request{Op: protocol.OpIncr, Binary: true, Opcode: 0x05, Key: []byte("k"), Delta: 1, Initial: 100, Create: true}
	binAddQ := protocol.Request{Op: protocol.OpAdd, Binary: true, Opcode: 0x12, Quiet: true, Key: []byte("k"), Value: []byte("q")}
	for _, tc := range []struct {
		name string
		req  protocol.Request // nil Op: the text wire
		wire string
		// forgets: a replica may miss the key afterwards, as a cache may forget it (a touch
		// is not carried, and mg's N placeholder, numbered by the first's cas, neither: a
		// read writes no replica), but none holds anything else.
		forgets bool
	}{
		{name: "incr", wire: "incr k 3\r\n"},
		{name: "decr", wire: "decr k 1\r\n"},
		{name: "incr noreply", wire: "incr k 3 noreply\r\n"},
		{name: "append", wire: "append k 0 0 1\r\nx\r\n"},
		{name: "prepend", wire: "prepend k 0 0 1\r\nx\r\n"},
		{name: "replace", wire: "replace k 0 0 1\r\nr\r\n"},
		{name: "add", wire: "add k 0 0 1\r\na\r\n"},
		{name: "touch", wire: "touch k 100\r\n", forgets: true},
		{name: "delete", wire: "delete k\r\n"},
		{name: "ma", wire: "ma k v\r\n"},
		{name: "ma with N", wire: "ma k N0 J9 v\r\n"},
		{name: "ma q with N", wire: "ma k q N0 J9 D2\r\n"},
		{name: "ms mode E", wire: "ms k 1 ME\r\nz\r\n"},
		{name: "ms mode A", wire: "ms k 1 MA\r\nz\r\n"},
		{name: "ms mode R", wire: "ms k 1 MR\r\nz\r\n"},
		{name: "gets", wire: "gets k\r\n"},
		{name: "gats", wire: "gats 100 k\r\n"},
		{name: "mg c", wire: "mg k c v\r\n"},
		{name: "mg with N", wire: "mg k N30 v\r\n", forgets: true},
		{name: "binary incr with initial", req: binIncr},
		{name: "binary addq", req: binAddQ},
	} {
		for _, held := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/held %v", tc.name, held), func(t *testing.T) {
				downs := []*servertest.Downable{servertest.NewDownable(), servertest.NewDownable()}
				pl := replicated(t, 2, replica.Options{StandIns: servertest.StandIns(t, 10)},
					pool.Member{Name: "a", Addr: "embedded/0", Weight: 1, Server: downs[0]},
					pool.Member{Name: "b", Addr: "embedded/1", Weight: 1, Server: downs[1]},
				)
				ref := memstore.New(memstore.Options{})
				set := pl.ReplicaSetOf([]byte("k"))
				decider := downs[set.Idx[0]]
				through := pl.Member(set.Idx[0]).Server
				do := func(s pool.Server, req protocol.Request) protocol.Response {
					t.Helper()
					var resp [1]protocol.Response
					if err := pool.Do(context.Background(), s, nil, &req, resp[:]); err != nil {
						t.Fatalf("%s: %v", req.Op, err)
					}
					return resp[0]
				}
				if held {
					setReq := decodeText(t, "set k 7 0 1\r\n5\r\n")
					do(through, setReq)
					do(ref, setReq)
					do(decider, decodeText(t, "delete k\r\n")) // the first replica restarted empty
				}
				req := tc.req
				if req.Op == 0 {
					req = decodeText(t, tc.wire)
				}
				got, want := outcome(&req, do(through, req)), outcome(&req, do(ref, req))
				if got != want {
					t.Errorf("answered %q, a store that never lost the key answers %q", got, want)
				}
				// What each replica holds now, against the store.
				look := decodeText(t, "mg k v f\r\n")
				wantHeld := outcome(&look, do(ref, look))
				for i, d := range downs {
					if got := outcome(&look, do(d, look)); tc.forgets && got == "EN\r\n" {
						continue
					}
					if got := outcome(&look, do(d, look)); got != wantHeld {
						t.Errorf("replica %d holds %q, the store %q", i, got, wantHeld)
					}
				}
			})
		}
	}
}

// TestReplicaCasAfterLoss: a gets through a replicated pool whose first replica lost the key
// answers the first's cas unique (the key copied to it), with which a cas write is stored.
func TestReplicaCasAfterLoss(t *testing.T) {
	downs := []*servertest.Downable{servertest.NewDownable(), servertest.NewDownable()}
	pl := replicated(t, 2, replica.Options{StandIns: servertest.StandIns(t, 10)},
		pool.Member{Name: "a", Addr: "embedded/0", Weight: 1, Server: downs[0]},
		pool.Member{Name: "b", Addr: "embedded/1", Weight: 1, Server: downs[1]},
	)
	for i := range 20 {
		k := fmt.Sprintf("k%d", i)
		set := pl.ReplicaSetOf([]byte(k))
		through := pl.Member(set.Idx[0]).Server
		var resp [1]protocol.Response
		_ = pool.Do(context.Background(), through, nil, &protocol.Request{Op: protocol.OpSet, Key: []byte(k), Value: []byte("v")}, resp[:])
		_ = pool.Do(context.Background(), downs[set.Idx[0]], nil, &protocol.Request{Op: protocol.OpDelete, Key: []byte(k)}, resp[:])
		if err := pool.Do(context.Background(), through, nil, &protocol.Request{Op: protocol.OpGets, Keys: [][]byte{[]byte(k)}}, resp[:]); err != nil || resp[0].Status != protocol.StatusOK {
			t.Fatalf("gets %s: %v %+v", k, err, resp[0])
		}
		cas := protocol.Request{Op: protocol.OpCas, Key: []byte(k), Value: []byte("w"), Cas: resp[0].Cas}
		if err := pool.Do(context.Background(), through, nil, &cas, resp[:]); err != nil || resp[0].Status != protocol.StatusOK {
			t.Errorf("cas %s with the cas unique gets answered: %v %+v, want STORED", k, err, resp[0])
		}
	}
}

// failingReads is a server that fails every meta get (a replica's read for a copy) as a
// server that did not answer, and executes everything else.
type failingReads struct{ pool.Server }

var errNoAnswer = errors.New("timeout (test)")

func (f failingReads) Start(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error, done func()) {
	if len(reqs) == 1 && reqs[0].Op == protocol.OpMetaGet {
		order.Dispatched()
		errs[0] = errNoAnswer
		done()
		return
	}
	f.Server.Start(ctx, order, reqs, resps, errs, done)
}

// TestReplicaLackingDeciderOtherSilent: a key's first replica lost the key, and the second,
// which holds it, does not answer the read for its copy. A conditional command then fails
// (the client sees a server error) rather than being decided on nothing: a binary incr
// with an initial value creates no new counter over the one the second holds, and an incr
// answers no NOT_FOUND for a key that exists.
func TestReplicaLackingDeciderOtherSilent(t *testing.T) {
	binIncr := protocol.Request{Op: protocol.OpIncr, Binary: true, Opcode: 0x05, Key: []byte("k"), Delta: 1, Initial: 100, Create: true}
	for _, tc := range []struct {
		name string
		req  protocol.Request
	}{
		{"binary incr with initial", binIncr},
		{"incr", decodeText(t, "incr k 1\r\n")},
		{"ma with N", decodeText(t, "ma k N0 J9 v\r\n")},
		{"append", decodeText(t, "append k 0 0 1\r\nx\r\n")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			downs := []*servertest.Downable{servertest.NewDownable(), servertest.NewDownable()}
			probe := replicated(t, 2, replica.Options{},
				pool.Member{Name: "a", Addr: "embedded/0", Weight: 1, Server: downs[0]},
				pool.Member{Name: "b", Addr: "embedded/1", Weight: 1, Server: downs[1]})
			set := probe.ReplicaSetOf([]byte("k"))
			first, second := set.Idx[0], set.Idx[1]
			members := []pool.Member{
				{Name: "a", Addr: "embedded/0", Weight: 1, Server: downs[0]},
				{Name: "b", Addr: "embedded/1", Weight: 1, Server: downs[1]},
			}
			members[second].Server = failingReads{downs[second]}
			pl := replicated(t, 2, replica.Options{StandIns: servertest.StandIns(t, 10)}, members...)
			through := pl.Member(first).Server
			var resp [1]protocol.Response
			for _, s := range []pool.Server{downs[second], downs[first]} {
				if err := pool.Do(context.Background(), s, nil, &protocol.Request{Op: protocol.OpSet, Key: []byte("k"), Value: []byte("5")}, resp[:]); err != nil {
					t.Fatal(err)
				}
			}
			_ = pool.Do(context.Background(), downs[first], nil, &protocol.Request{Op: protocol.OpDelete, Key: []byte("k")}, resp[:]) // restarted empty

			req := tc.req
			err := pool.Do(context.Background(), through, nil, &req, resp[:])
			if err == nil {
				t.Errorf("answered %q, want a failure: the replica holding the key did not answer", outcome(&req, resp[0]))
			}
			look := decodeText(t, "mg k v\r\n")
			if err := pool.Do(context.Background(), downs[second], nil, &look, resp[:]); err != nil || string(resp[0].Value) != "5" {
				t.Errorf("the second replica holds %q (%v), want the 5 it held", resp[0].Value, err)
			}
			if err := pool.Do(context.Background(), downs[first], nil, &look, resp[:]); err != nil || resp[0].Meta.Code != protocol.MetaEN {
				t.Errorf("the first replica holds %q (%v), want nothing: it decided nothing", resp[0].Value, err)
			}
		})
	}
}
