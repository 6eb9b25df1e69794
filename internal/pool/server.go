package pool

import (
	"context"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

// Server executes requests on one memcached server: a remote one over the binary protocol,
// or an embedded in-process store.
type Server interface {
	// Do executes req and fills resps: for a retrieval (get, gets, gat, gats) one Response per
	// req.Keys[i] in resps[i], with Key set; for any other command resps[0]. len(resps) is
	// exactly that. A non-nil error means the server did not answer (timeout, connection
	// failure) and resps are undefined; every answer the server gave, including a miss or
	// NOT_STORED, is a Status with a nil error. Do is safe for concurrent use. req and its
	// bytes are valid only during the call.
	Do(ctx context.Context, req *protocol.Request, resps []protocol.Response) error
}
