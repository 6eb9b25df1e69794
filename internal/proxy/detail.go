package proxy

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

// prefixDelimiter ends a key's prefix in "stats detail": memcached's default (its -D
// option, which moxi does not have).
const prefixDelimiter = ':'

// maxPrefixes bounds the prefixes "stats detail" counts. memcached has no bound, so a client
// writing keys with ever-new prefixes grows its table for as long as detail is on; moxi
// stops there instead: once maxPrefixes are counted, a key of a new prefix is not counted
// (the prefixes already counted go on). At most 249 bytes a prefix, the table stays within
// a few MB. "stats reset" empties it.
const maxPrefixes = 10000

// prefixStats are the per-prefix counters of memcached's "stats detail": for each key
// prefix (the key up to its first ':'), the keys asked by get/gets/gat/gats (and binary
// touch) and how many of them hit, the set-type writes and the deletes. Collection is off
// until "stats detail on". The zero value is off and empty; safe for concurrent use.
type prefixStats struct {
	on atomic.Bool // "stats detail on": record counts; while off, record costs one load

	// mu guards the map; the counters in it are atomic, so recording takes only the read
	// lock, and the write lock is for a new prefix and for reset. A record adds under the
	// read lock, so a reset cannot slip between finding a prefix's counts and adding to
	// them (which would lose the add into a table already dropped).
	mu       sync.RWMutex
	prefixes map[string]*prefixCounts
}

// prefixCounts are one prefix's counters, in "stats detail dump" order.
type prefixCounts struct {
	get, hit, set, del atomic.Uint64
}

// record counts an answered request, when collection is on. It is small enough to be
// inlined, so that with detail off a request pays one atomic load.
func (d *prefixStats) record(req *protocol.Request, resps []protocol.Response) {
	if d.on.Load() {
		d.count(req, resps)
	}
}

// count records req as memcached does: every key asked by a get (one per key, a hit when
// it was found, whether or not a server answered), every set-type write whatever its
// outcome, every delete. Binary touch counts as a get, as on memcached (it shares get's
// code there); text touch, incr/decr and the meta commands count nothing.
func (d *prefixStats) count(req *protocol.Request, resps []protocol.Response) {
	switch req.Op {
	case protocol.OpGet, protocol.OpGets, protocol.OpGat, protocol.OpGats:
		for i, k := range req.Keys {
			if i < len(resps) {
				d.add(k, func(c *prefixCounts) { c.get.Add(1); hit(c, resps[i]) })
			}
		}
	case protocol.OpTouch:
		if req.Binary && len(resps) > 0 {
			d.add(req.Key, func(c *prefixCounts) { c.get.Add(1); hit(c, resps[0]) })
		}
	case protocol.OpSet, protocol.OpAdd, protocol.OpReplace, protocol.OpAppend, protocol.OpPrepend, protocol.OpCas:
		d.add(req.Key, func(c *prefixCounts) { c.set.Add(1) })
	case protocol.OpDelete:
		d.add(req.Key, func(c *prefixCounts) { c.del.Add(1) })
	}
}

func hit(c *prefixCounts, resp protocol.Response) {
	if resp.Status == protocol.StatusOK {
		c.hit.Add(1)
	}
}

// add applies inc to the counts of key's prefix, creating them if there is room. A key
// without the delimiter has no prefix and is not counted; nor is one with a NUL byte
// before it (memcached reads the key as a C string there; only binary keys can hold one).
func (d *prefixStats) add(key []byte, inc func(*prefixCounts)) {
	n := bytes.IndexByte(key, prefixDelimiter)
	if n < 0 || bytes.IndexByte(key[:n], 0) >= 0 {
		return
	}
	prefix := key[:n]
	d.mu.RLock()
	c := d.prefixes[string(prefix)]
	if c != nil {
		inc(c)
		d.mu.RUnlock()
		return
	}
	d.mu.RUnlock()

	d.mu.Lock()
	defer d.mu.Unlock()
	if c = d.prefixes[string(prefix)]; c == nil { // another request may have made it
		if len(d.prefixes) >= maxPrefixes {
			return
		}
		if d.prefixes == nil {
			d.prefixes = make(map[string]*prefixCounts)
		}
		c = new(prefixCounts)
		d.prefixes[string(prefix)] = c
	}
	inc(c)
}

// reset forgets every prefix, for "stats reset". Whether collection is on is kept.
func (d *prefixStats) reset() {
	d.mu.Lock()
	d.prefixes = nil
	d.mu.Unlock()
}

// dump is memcached's "stats detail dump" answer: a line
// "PREFIX <prefix> get <n> hit <n> set <n> del <n>\r\n" per prefix, then "END\r\n".
// memcached lists the prefixes in the order of its hash table, which means nothing; moxi
// sorts them, so that two dumps compare line by line.
func (d *prefixStats) dump() []byte {
	d.mu.RLock()
	var out []byte
	for _, name := range slices.Sorted(maps.Keys(d.prefixes)) {
		c := d.prefixes[name]
		out = fmt.Appendf(out, "PREFIX %s get %d hit %d set %d del %d\r\n", name, c.get.Load(), c.hit.Load(), c.set.Load(), c.del.Load())
	}
	d.mu.RUnlock()
	return append(out, "END\r\n"...)
}
