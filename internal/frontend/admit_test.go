package frontend

import (
	"net"
	"testing"
	"testing/synctest"

	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// TestFirstGetAdmittedPastGlobalBound: while other connections hold the global bound (the
// total past it, by up to one connection's worth), a new connection's first get — its
// answer's size not yet measured, the server's estimate larger than a share — is admitted
// at once: it reserves what is left of its share, not a whole share on top of its request.
func TestFirstGetAdmittedPastGlobalBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &Server{MaxBufferedBytes: 2 << 20, MaxConnectionBytes: 1 << 20}
		s.buffered.Store(2<<20 + 20_000) // the others' bytes
		s.current.Store(8)
		s.perKey.Store(512 << 10) // what their answers measured: past a share (256 KiB)
		server, client := net.Pipe()
		defer server.Close()
		defer client.Close()
		c := newConn(s, nil, server, turn.NewChain(0))
		tk := &task{req: protocol.Request{Op: protocol.OpGet, Keys: [][]byte{[]byte("small")}}, valueKeys: 1, requests: 1, weight: 1}
		admitted := make(chan struct{})
		go func() {
			c.admit(tk)
			close(admitted)
		}()
		synctest.Wait()
		select {
		case <-admitted:
		default:
			t.Fatalf("a new connection's first get waits while others hold the global bound (it would hold %d of a share of %d)", c.acct.held.Load()+tk.held, s.share())
		}
		if held := c.acct.held.Load(); held > s.share() {
			t.Errorf("the get holds %d, past its share %d", held, s.share())
		}
	})
}
