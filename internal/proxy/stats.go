package proxy

import (
	"bytes"
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/topology"
)

// counters are the proxy's own memcached-style statistics, answered to "stats".
type counters struct {
	n      [numCounters]atomic.Uint64 // indexed by cmdGet...backendErrors
	detail prefixStats                // "stats detail": counts per key prefix, while on
}

// The counters of "stats", in the order it lists them (counterNames).
const (
	cmdGet = iota
	cmdSet
	cmdFlush
	cmdTouch
	getHits
	getMisses
	deleteMisses
	deleteHits
	incrMisses
	incrHits
	decrMisses
	decrHits
	casMisses
	casHits
	casBadval
	touchHits
	touchMisses
	backendErrors
	numCounters
)

// counterNames are the counters' names in "stats", memcached's.
var counterNames = [numCounters]string{
	cmdGet: "cmd_get", cmdSet: "cmd_set", cmdFlush: "cmd_flush", cmdTouch: "cmd_touch",
	getHits: "get_hits", getMisses: "get_misses", deleteMisses: "delete_misses", deleteHits: "delete_hits",
	incrMisses: "incr_misses", incrHits: "incr_hits", decrMisses: "decr_misses", decrHits: "decr_hits",
	casMisses: "cas_misses", casHits: "cas_hits", casBadval: "cas_badval",
	touchHits: "touch_hits", touchMisses: "touch_misses", backendErrors: "backend_errors",
}

// reset zeroes the counters and forgets the prefixes of "stats detail", for "stats reset"
// (the Prometheus counters are not touched: they only ever grow).
func (c *counters) reset() {
	c.detail.reset()
	for i := range c.n {
		c.n[i].Store(0)
	}
}

// add adds what n counted.
func (c *counters) add(n *tally) {
	for i, v := range n.counters {
		if v != 0 {
			c.n[i].Add(v)
		}
	}
}

// statsResponse answers every stats group memcached knows, so that a client waiting for
// END never hangs on a proxy:
//   - "" is the proxy's own counters, in memcached's names;
//   - "proxy" is each server's stats, prefixed "pool:server:";
//   - "settings" is the running config (Options.Settings);
//   - "items", "slabs", "sizes", "conns" and "cachedump" are empty: they describe one
//     memcached's memory, which a proxy in front of many has none of (ask the servers);
//   - "detail on|off|dump" is moxi's count per key prefix, as memcached's (prefixStats);
//   - "reset" answers as memcached does.
//
// Any other group is unknown (ERROR), as on memcached.
func (p *Proxy) statsResponse(ctx context.Context, t *topology.Topology, req *protocol.Request) protocol.Response {
	group, rest, _ := strings.Cut(string(req.Args), " ")
	switch group {
	case "":
		return protocol.Response{Stats: p.generalStats()}
	case "proxy":
		return protocol.Response{Stats: p.serverStats(t)}
	case "settings":
		var st []protocol.Stat
		if p.opts.Settings != nil {
			st = p.opts.Settings()
		}
		return protocol.Response{Stats: nonNil(st)}
	case "items", "slabs", "sizes", "conns":
		return protocol.Response{Stats: []protocol.Stat{}}
	case "cachedump":
		// memcached's checks, then its answer for a slab class holding nothing.
		f := strings.Fields(rest)
		if len(f) < 2 {
			return protocol.Response{Status: protocol.StatusInvalid, Msg: "bad command line"}
		}
		id, err1 := strconv.ParseUint(f[0], 10, 32)
		_, err2 := strconv.ParseUint(f[1], 10, 32)
		switch {
		case err1 != nil || err2 != nil:
			return protocol.Response{Status: protocol.StatusInvalid, Msg: "bad command line format"}
		case id >= maxSlabClasses:
			return protocol.Response{Status: protocol.StatusInvalid, Msg: "Illegal slab id"}
		}
		return protocol.Response{Stats: []protocol.Stat{}}
	case "detail":
		return p.statsDetail(req, rest)
	case "reset":
		p.stats.reset()
		p.features.Backup.Reset()
		return protocol.Response{Value: []byte("RESET")}
	default:
		return protocol.Response{Status: protocol.StatusUnknownCommand}
	}
}

// statsDetail answers "stats detail <sub>" as memcached does: on and off answer OK (in
// binary, an empty stats answer), dump the prefix lines then END. Only the first word
// counts, as on memcached. Binary has no room for lines outside a stat, so there the dump
// is one stat named "detailed" holding every line, END included, as memcached sends it.
func (p *Proxy) statsDetail(req *protocol.Request, sub string) protocol.Response {
	word, _, _ := strings.Cut(strings.TrimLeft(sub, " "), " ")
	d := &p.stats.detail
	switch word {
	case "on", "off":
		d.on.Store(word == "on")
		return protocol.Response{Value: []byte("OK")}
	case "dump":
		dump := d.dump()
		if req.Binary {
			return protocol.Response{Stats: []protocol.Stat{{Name: "detailed", Value: string(dump)}}}
		}
		return protocol.Response{Value: bytes.TrimSuffix(dump, []byte("\r\n"))} // the encoder ends the line
	}
	if req.Binary {
		return protocol.Response{Status: protocol.StatusNotFound}
	}
	return protocol.Response{Status: protocol.StatusInvalid, Msg: "usage: stats detail on|off|dump"}
}

// maxSlabClasses is memcached's MAX_NUMBER_OF_SLAB_CLASSES, the bound of "stats cachedump".
const maxSlabClasses = 64

func nonNil(st []protocol.Stat) []protocol.Stat {
	if st == nil {
		return []protocol.Stat{}
	}
	return st
}

func (p *Proxy) generalStats() []protocol.Stat {
	var cur, total uint64
	if p.opts.Connections != nil {
		cur, total = p.opts.Connections()
	}
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	now := time.Now()
	c, b := &p.stats, &p.features.Backup
	ffWritten, ffFailed := p.queue.Counts()
	u := func(v uint64) string { return strconv.FormatUint(v, 10) }
	tv := func(t syscall.Timeval) string { // Usec is an int32 on darwin
		return strconv.FormatInt(t.Sec, 10) + "." + leftPad(strconv.FormatInt(int64(t.Usec), 10), 6)
	}
	st := []protocol.Stat{
		{Name: "pid", Value: strconv.Itoa(os.Getpid())},
		{Name: "uptime", Value: strconv.FormatInt(int64(now.Sub(p.started)/time.Second), 10)},
		{Name: "time", Value: strconv.FormatInt(now.Unix(), 10)},
		{Name: "version", Value: p.version},
		{Name: "pointer_size", Value: strconv.Itoa(strconv.IntSize)},
		{Name: "rusage_user", Value: tv(ru.Utime)},
		{Name: "rusage_system", Value: tv(ru.Stime)},
		{Name: "max_connections", Value: strconv.Itoa(p.opts.MaxConnections)},
		{Name: "curr_connections", Value: u(cur)},
		{Name: "total_connections", Value: u(total)},
	}
	for i, name := range counterNames {
		st = append(st, protocol.Stat{Name: name, Value: u(c.n[i].Load())})
	}
	return append(st, []protocol.Stat{
		{Name: "backup_reads", Value: u(b.Reads.Load())},
		{Name: "backup_hits", Value: u(b.Hits.Load())},
		{Name: "backup_writes", Value: u(b.Writes.Load())},
		{Name: "backup_write_errors", Value: u(b.WriteErrors.Load())},
		{Name: "backup_writes_dropped", Value: u(b.WritesDropped.Load())},
		{Name: "fire_and_forget_pending", Value: strconv.Itoa(p.queue.Pending())},
		{Name: "fire_and_forget_written", Value: u(ffWritten)},
		{Name: "fire_and_forget_failed", Value: u(ffFailed)},
		{Name: "threads", Value: strconv.Itoa(runtime.GOMAXPROCS(0))},
	}...)
}

func leftPad(s string, n int) string {
	for len(s) < n {
		s = "0" + s
	}
	return s
}

// serverStats lists every server with its "stats proxy" lines, each prefixed
// "pool:server:": a remote server's are moxi's counters for it, an embedded store's are its
// memcached-style stats.
func (p *Proxy) serverStats(t *topology.Topology) []protocol.Stat {
	var out []protocol.Stat
	for _, pl := range t.Pools {
		for i := range pl.Len() {
			m := pl.Member(i)
			prefix := pl.Name() + ":" + m.Name + ":"
			out = append(out, protocol.Stat{Name: prefix + "addr", Value: m.Addr},
				protocol.Stat{Name: prefix + "weight", Value: strconv.Itoa(m.Weight)})
			for _, st := range m.Server.Stats() {
				out = append(out, protocol.Stat{Name: prefix + st.Name, Value: st.Value})
			}
		}
	}
	return out
}
