package bgqueue

import "github.com/moxi-proxy/moxi/internal/protocol"

// CopyRequest copies what a server needs of req into one new buffer: request bytes belong
// to the client's connection, and a queued copy outlives the handler of the request.
// Replies the client asked to suppress (quiet, noreply, a meta q flag) are asked for: the
// copy's answer goes to its queue's handler, not to the client.
func CopyRequest(req *protocol.Request) protocol.Request {
	c := protocol.Request{
		Op: req.Op, Flags: req.Flags, Exptime: req.Exptime, Cas: req.Cas, Delta: req.Delta,
		Initial: req.Initial, Create: req.Create, Opcode: req.Opcode, Binary: req.Binary, WithKey: req.WithKey,
		Key: req.Key, Value: req.Value, Keys: req.Keys,
	}
	var flags []protocol.MetaFlag
	if req.Op.IsMeta() {
		c.Meta = req.Meta
		c.Meta.Quiet = false
		c.Meta.Flags = make([]protocol.MetaFlag, 0, len(req.Meta.Flags))
		for _, f := range req.Meta.Flags {
			if f.Letter != 'q' {
				c.Meta.Flags = append(c.Meta.Flags, f)
			}
		}
		flags = c.Meta.Flags[:0] // Own copies each flag onto itself, its token into data
	}
	data := make([]byte, 0, c.DataBytes())
	var keys [][]byte
	if len(c.Keys) > 0 {
		keys = make([][]byte, 0, len(c.Keys))
	}
	c.Own(&data, &keys, &flags)
	return c
}

// Weight is what a copy of req counts against MaxBytes, by m: with Memory, its data and
// about 256 bytes of structs, 24 more a key or meta flag.
func Weight(req *protocol.Request, m Measure) int64 {
	n := req.DataBytes()
	if m == Memory {
		n += 256 + 24*(len(req.Keys)+len(req.Meta.Flags))
	}
	return int64(n)
}
