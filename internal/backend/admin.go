package backend

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// doText sends a server-admin command the binary protocol has no opcode for
// (cache_memlimit) in the text protocol, on a connection of its own, and reads memcached's
// one-line answer into resps[0]: OK, or its other line in resp.Value (through
// protocol.OneLine). Such commands are rare; a connection kept for them would be idle. A
// server that requires SASL does not speak text: moxi answers (sasl.go).
func (s *Server) doText(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response) error {
	resp := &resps[0]
	defer order.Dispatched()
	if s.opts.SASL.set() {
		*resp = binaryOnly(req.Op.String() + " is")
		return nil
	}
	nc, err := s.dial(ctx)
	if err != nil {
		return fmt.Errorf("%s: connect: %w", s.opts.Addr, err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(s.opts.Timeout))
	if _, err := nc.Write(protocol.AppendTextRequest(nil, req)); err != nil {
		return fmt.Errorf("%s: %w", s.opts.Addr, err)
	}
	line, err := bufio.NewReaderSize(nc, 512).ReadSlice('\n') // a longer line is no answer of memcached's
	if err != nil {
		return fmt.Errorf("%s: %w", s.opts.Addr, err)
	}
	*resp = protocol.Response{}
	if line = bytes.TrimSuffix(line, []byte("\r\n")); string(line) != "OK" {
		resp.Value = protocol.OneLine(bytes.Clone(line))
	}
	return nil
}
