package migrate

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/moxi-proxy/moxi/internal/itemcopy"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// oldServer talks to the server being migrated from over a few text connections.
type oldServer struct {
	addr     string
	timeout  time.Duration
	maxValue int
	conns    chan *textConn // idle connections; nil entries are slots not dialed yet
	dial     Dialer         // nil: plain TCP
	lruOnly  atomic.Bool    // the server refused "metadump hash": list its LRUs
}

// Dialer opens a connection to the server at addr, as the pool's other connections to its
// servers are opened (backend.Dial: TCP, or TLS when the pool has it), until ctx ends.
type Dialer func(ctx context.Context, addr string) (net.Conn, error)

// open dials the old server within the timeout.
func (o *oldServer) open(ctx context.Context) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	var nc net.Conn
	var err error
	if o.dial != nil {
		nc, err = o.dial(ctx, o.addr)
	} else {
		var d net.Dialer
		nc, err = d.DialContext(ctx, "tcp", o.addr)
	}
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", o.addr, err)
	}
	return nc, nil
}

type textConn struct {
	nc net.Conn
	r  *bufio.Reader
}

func newOldServer(addr string, conns int, timeout time.Duration, maxValue int, dial Dialer) *oldServer {
	o := &oldServer{addr: addr, timeout: timeout, maxValue: maxValue, conns: make(chan *textConn, conns), dial: dial}
	for range conns {
		o.conns <- nil
	}
	return o
}

// limits bound what the old server's answers may make moxi read: values up to maxValue.
func (o *oldServer) limits() protocol.Limits {
	return protocol.Limits{MaxValueBytes: o.maxValue}
}

// with runs fn on an idle connection (dialing it if needed), with a deadline. A connection
// that fn fails on is closed: like gomemcache, only a connection known to be clean goes back.
func (o *oldServer) with(ctx context.Context, deadline time.Duration, fn func(c *textConn) error) error {
	var c *textConn
	select {
	case c = <-o.conns:
	case <-ctx.Done():
		return ctx.Err()
	}
	if c == nil {
		nc, err := o.open(ctx)
		if err != nil {
			o.conns <- nil
			return err
		}
		c = &textConn{nc: nc, r: bufio.NewReaderSize(nc, 64<<10)}
	}
	_ = c.nc.SetDeadline(time.Now().Add(deadline))
	if err := fn(c); err != nil {
		c.nc.Close()
		o.conns <- nil
		return fmt.Errorf("%s: %w", o.addr, err)
	}
	o.conns <- c
	return nil
}

// get reads keys, pipelined: one round trip for the batch.
func (o *oldServer) get(ctx context.Context, keys [][]byte) ([]itemcopy.Item, error) {
	items := make([]itemcopy.Item, len(keys))
	err := o.with(ctx, o.timeout+time.Duration(len(keys))*time.Millisecond, func(c *textConn) error {
		var buf []byte
		for _, k := range keys {
			req := itemcopy.Get(k)
			buf = protocol.AppendMetaRequest(buf, &req)
		}
		if _, err := c.nc.Write(buf); err != nil {
			return err
		}
		for i := range keys {
			it, err := readItem(c.r, o.limits())
			if err != nil {
				return err
			}
			items[i] = it
		}
		return nil
	})
	return items, err
}

// delete deletes key and reports whether it was there; a missing key is no error.
func (o *oldServer) delete(ctx context.Context, key []byte) (found bool, err error) {
	err = o.with(ctx, o.timeout, func(c *textConn) error {
		req := itemcopy.Delete(key)
		if _, err := c.nc.Write(protocol.AppendMetaRequest(nil, &req)); err != nil {
			return err
		}
		found, err = readDeleted(c.r, o.limits())
		return err
	})
	return found, err
}

// deleteAll deletes keys, pipelined: one round trip for the batch. A missing key is no
// error.
func (o *oldServer) deleteAll(ctx context.Context, keys [][]byte) error {
	return o.with(ctx, o.timeout+time.Duration(len(keys))*time.Millisecond, func(c *textConn) error {
		var buf []byte
		for _, k := range keys {
			req := itemcopy.Delete(k)
			buf = protocol.AppendMetaRequest(buf, &req)
		}
		if _, err := c.nc.Write(buf); err != nil {
			return err
		}
		for range keys {
			if _, err := readDeleted(c.r, o.limits()); err != nil {
				return err
			}
		}
		return nil
	})
}

// errCrawlerBusy is memcached's answer to a metadump while its crawler is busy with another
// (in a tier, another proxy's copy lists the same OLD).
var errCrawlerBusy = errors.New("crawler busy")

// crawlerRetry is how long dump waits before asking a busy crawler again.
const crawlerRetry = 500 * time.Millisecond

// errNoHashDump is a server's refusal of "lru_crawler metadump hash" (before memcached 1.6).
var errNoHashDump = errors.New("no metadump hash")

// dump lists the server's items with "lru_crawler metadump hash", which walks the hash
// table, where an item stays while clients read it; "metadump all" walks the LRUs, where a
// read moves it, and missed 4 of 3,200 keys a pass under a read load (a server that refuses
// hash is listed that way). While the crawler is busy with another listing, it waits for
// it, until ctx ends.
func (o *oldServer) dump(ctx context.Context, each func(DumpEntry) error) error {
	for {
		err := o.dumpOnce(ctx, each)
		if errors.Is(err, errNoHashDump) {
			o.lruOnly.Store(true)
			continue
		}
		if !errors.Is(err, errCrawlerBusy) {
			return err
		}
		select {
		case <-time.After(crawlerRetry):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// dumpOnce lists the items once, on a connection of its own: the crawler streams, and
// nothing else may share the connection meanwhile.
func (o *oldServer) dumpOnce(ctx context.Context, each func(DumpEntry) error) error {
	nc, err := o.open(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	defer stop()
	how := "hash"
	if o.lruOnly.Load() {
		how = "all"
	}
	if _, err := nc.Write([]byte("lru_crawler metadump " + how + "\r\n")); err != nil {
		return err
	}
	first := true
	r := bufio.NewReaderSize(nc, 64<<10)
	for {
		// The crawler may pause between batches; a long silence means it is stuck. (Set
		// before reading the socket, not for every line already buffered: a listing is a
		// server's every key.)
		if r.Buffered() == 0 {
			_ = nc.SetReadDeadline(time.Now().Add(30 * time.Second))
		}
		line, err := readLine(r)
		if err != nil {
			return fmt.Errorf("metadump from %s: %w", o.addr, err)
		}
		switch {
		case string(line) == "END":
			return nil
		case bytes.HasPrefix(line, []byte("BUSY")):
			return fmt.Errorf("metadump from %s: %s: %w", o.addr, line, errCrawlerBusy)
		case first && how == "hash" && (bytes.HasPrefix(line, []byte("ERROR")) || bytes.HasPrefix(line, []byte("CLIENT_ERROR"))):
			return fmt.Errorf("metadump hash from %s: %s: %w", o.addr, line, errNoHashDump)
		case bytes.HasPrefix(line, []byte("ERROR")), bytes.HasPrefix(line, []byte("CLIENT_ERROR")):
			return fmt.Errorf("metadump from %s: %s", o.addr, line)
		}
		first = false
		if e, ok := ParseMetadumpLine(line); ok {
			if err := each(e); err != nil {
				return err
			}
		}
	}
}

// close closes the idle connections; one in use is closed when it comes back failing, or
// by the garbage collector.
func (o *oldServer) close() {
	for range cap(o.conns) {
		select {
		case c := <-o.conns:
			if c != nil {
				c.nc.Close()
			}
			defer func() { o.conns <- nil }() // a late user may still dial
		default:
		}
	}
}

// flushOld sends flush_all (with its delay) to the old server, so that a flush during the
// migration empties both sides.
func flushOld(c *textConn, delay int64, resp *protocol.Response) error {
	cmd := "flush_all\r\n"
	if delay > 0 {
		cmd = "flush_all " + strconv.FormatInt(delay, 10) + "\r\n"
	}
	if _, err := c.nc.Write([]byte(cmd)); err != nil {
		return err
	}
	line, err := readLine(c.r)
	if err != nil {
		return err
	}
	if string(line) != "OK" {
		resp.Status = protocol.StatusTempFailure
		return fmt.Errorf("%w: flush_all answered %q", errMeta, line)
	}
	return nil
}
