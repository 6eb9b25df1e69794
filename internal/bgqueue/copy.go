package bgqueue

import "github.com/moxi-proxy/moxi/internal/protocol"

// CopyRequest copies what a server needs of req into one new buffer: request bytes belong
// to the client's connection, and a queued copy outlives the handler of the request.
// Replies the client asked to suppress (quiet, noreply, a meta q flag) are asked for: the
// copy's answer goes to its queue's handler, not to the client.
func CopyRequest(req *protocol.Request) protocol.Request {
	buf := make([]byte, 0, dataBytes(req))
	clone := func(b []byte) []byte {
		if b == nil {
			return nil
		}
		buf = append(buf, b...)
		return buf[len(buf)-len(b) : len(buf) : len(buf)]
	}
	c := protocol.Request{
		Op: req.Op, Flags: req.Flags, Exptime: req.Exptime, Cas: req.Cas, Delta: req.Delta,
		Initial: req.Initial, Create: req.Create, Opcode: req.Opcode, Binary: req.Binary, WithKey: req.WithKey,
	}
	c.Key = clone(req.Key)
	c.Value = clone(req.Value)
	if len(req.Keys) > 0 {
		c.Keys = make([][]byte, len(req.Keys))
		for i, k := range req.Keys {
			c.Keys[i] = clone(k)
		}
	}
	if req.Op.IsMeta() {
		c.Meta = req.Meta
		c.Meta.KeyToken = clone(req.Meta.KeyToken)
		c.Meta.Flags = make([]protocol.MetaFlag, 0, len(req.Meta.Flags))
		for _, f := range req.Meta.Flags {
			if f.Letter == 'q' {
				continue
			}
			c.Meta.Flags = append(c.Meta.Flags, protocol.MetaFlag{Letter: f.Letter, Token: clone(f.Token)})
		}
		c.Meta.Quiet = false
	}
	return c
}

// dataBytes is the bytes req carries, which CopyRequest copies: its keys, value and meta
// tokens.
func dataBytes(req *protocol.Request) int {
	n := len(req.Key) + len(req.Value) + len(req.Meta.KeyToken)
	for _, k := range req.Keys {
		n += len(k)
	}
	for _, f := range req.Meta.Flags {
		n += len(f.Token)
	}
	return n
}

// Weight is what a copy of req counts against MaxBytes, by m: with Memory, its data and
// about 256 bytes of structs, 24 more a key or meta flag.
func Weight(req *protocol.Request, m Measure) int64 {
	n := dataBytes(req)
	if m == Memory {
		n += 256 + 24*(len(req.Keys)+len(req.Meta.Flags))
	}
	return int64(n)
}
