// Package itemcopy reads an item with what a copy of it needs — its value, client flags and
// remaining TTL — and writes such a copy elsewhere: the requests and their answers, plain
// functions over protocol values. Warm-up (a pool's warm_from) and replica repair copy items
// this way.
package itemcopy

import (
	"bytes"
	"encoding/base64"
	"strconv"
	"time"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

// Item is what a server holds of a key.
type Item struct {
	Found bool
	Value []byte
	Flags uint32
	TTL   int64 // remaining seconds; -1: no expiry
}

// Delete is "md <key>", the key sent as Get sends it.
func Delete(k []byte) protocol.Request { return keyed(protocol.OpMetaDelete, k) }

// Get is "mg <key> v f t": the value, its client flags and its remaining TTL.
func Get(k []byte) protocol.Request {
	req := keyed(protocol.OpMetaGet, k)
	req.Meta.ReturnValue = true
	req.Meta.Flags = append(req.Meta.Flags, protocol.MetaFlag{Letter: 'v'}, protocol.MetaFlag{Letter: 'f'}, protocol.MetaFlag{Letter: 't'})
	return req
}

// keyed is a meta request op of key k: a key that is no text token (a binary client's)
// goes base64 with b.
func keyed(op protocol.Op, k []byte) protocol.Request {
	req := protocol.Request{Op: op, Key: k}
	req.Meta.KeyToken = k
	if !textToken(k) {
		req.Meta.KeyToken = base64.StdEncoding.AppendEncode(nil, k)
		req.Meta.Base64 = true
		req.Meta.Flags = append(req.Meta.Flags, protocol.MetaFlag{Letter: 'b'})
	}
	return req
}

func textToken(k []byte) bool {
	if len(k) == 0 || len(k) > protocol.MaxKeyLength {
		return false
	}
	for _, c := range k {
		if c <= ' ' || c == 0x7f {
			return false
		}
	}
	return true
}

// Parse reads the answer to Get: VA with " f<flags> t<ttl>", or a miss.
func Parse(r *protocol.Response) Item {
	if r.Meta.Code != protocol.MetaVA {
		return Item{}
	}
	it := Item{Found: true, Value: r.Value, TTL: -1}
	for _, tok := range bytes.Fields(r.Meta.Flags) {
		if len(tok) < 2 {
			continue
		}
		switch tok[0] {
		case 'f':
			if f, err := strconv.ParseUint(string(tok[1:]), 10, 32); err == nil {
				it.Flags = uint32(f)
			}
		case 't':
			if n, err := strconv.ParseInt(string(tok[1:]), 10, 64); err == nil {
				it.TTL = n
			}
		}
	}
	return it
}

// Exptime is the expiry for a copy of an item with ttl seconds left, and false when it must
// not be copied (under a second left). memcached reads values over 30 days as absolute
// times. A TTL is never extended: memcached reports it in whole seconds, rounded down.
func Exptime(ttl int64) (int64, bool) {
	switch {
	case ttl < 0:
		return 0, true
	case ttl == 0:
		return 0, false
	case ttl > 30*24*3600:
		return time.Now().Unix() + ttl, true
	}
	return ttl, true
}

// Store is the request that writes it as k with op (add: a copy that never overwrites; set:
// a result carried to a server that must hold it) and exptime.
func Store(op protocol.Op, k []byte, it *Item, exptime int64) protocol.Request {
	return protocol.Request{Op: op, Key: k, Value: it.Value, Flags: it.Flags, Exptime: exptime}
}
