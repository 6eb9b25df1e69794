package test

import (
	"bufio"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// BenchmarkReshardFloor is the floor of BenchmarkReshard/live: the memcached side of the
// same move with nothing else. Three servers behind moxi hold 100,000 keys of 100 bytes
// while 8 clients get them through moxi; a bare copier, not moxi, lists each server with
// "lru_crawler metadump all" and moves a quarter of the keys to a fourth server (mg on the
// old, ms add on the new, md on the old, 250 keys a pipelined batch, the three old servers
// at once). Any design that copies by listing does this work on the same two cores; the
// p99 of the gets while it runs is what that work alone costs them. "list" only lists;
// "control" does nothing for as long as a move takes, the p99 of the same window without it.
func BenchmarkReshardFloor(b *testing.B) {
	for _, work := range []string{"control", "list", "move"} {
		b.Run(work, func(b *testing.B) { reshardFloor(b, work) })
	}
}

func reshardFloor(b *testing.B, work string) {
	move := work == "move"
	for b.Loop() {
		var mcs []*memcachedtest.Server
		for range 4 {
			mcs = append(mcs, memcachedtest.Start(b, "-m", "1024"))
		}
		var w strings.Builder
		w.WriteString("watch_config: false\npools:\n  main:\n    servers:\n")
		for i := range 3 {
			fmt.Fprintf(&w, "      - {name: s%d, addr: %q}\n", i, mcs[i].Addr)
		}
		moxi := startMoxiBin(b, fastMoxi(b), "--config", writeConfig(b, w.String()))
		const keys = 100_000
		fill(b, moxi.addr, "r:", keys, 100)
		key := func(i int) string { return "r:" + strconv.Itoa(i%keys) }
		before := p99(getLatencies(b, moxi.addr, 2*time.Second, key))

		var moved atomic.Int64
		finished := make(chan struct{})
		start := time.Now()
		var took time.Duration
		go func() {
			defer close(finished)
			if work == "control" { // a window as long as a move's, with no work in it: waited out, not polled
				<-time.After(200 * time.Millisecond)
				took = time.Since(start)
				return
			}
			var wg sync.WaitGroup
			for _, old := range mcs[:3] {
				wg.Go(func() {
					n, err := bareMove(old.Addr, mcs[3].Addr, move)
					if err != nil {
						b.Error(err)
					}
					moved.Add(int64(n))
				})
			}
			wg.Wait()
			took = time.Since(start)
		}()
		lat := timedGets(b, moxi.addr, 0, finished, key)
		<-finished
		during := p99(lat)
		if move {
			b.ReportMetric(float64(moved.Load())/took.Seconds(), "moved-keys/s")
			b.ReportMetric(float64(moved.Load()), "moved-keys")
		}
		b.ReportMetric(float64(took.Milliseconds()), "ms")
		b.ReportMetric(float64(before.Microseconds()), "p99-before-µs")
		b.ReportMetric(float64(during.Microseconds()), "p99-copying-µs")
		b.ReportMetric(float64(during)/float64(before), "p99-ratio")
	}
}

// bareMove lists old and, if move, moves its keys whose FNV-1a hash is 0 mod 4 to new; it
// returns how many it moved.
func bareMove(old, new string, move bool) (int, error) {
	dial := func(addr string) (net.Conn, *bufio.Reader, error) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return nil, nil, err
		}
		return c, bufio.NewReaderSize(c, 64<<10), nil
	}
	list, listR, err := dial(old)
	if err != nil {
		return 0, err
	}
	defer list.Close()
	from, fromR, err := dial(old)
	if err != nil {
		return 0, err
	}
	defer from.Close()
	to, toR, err := dial(new)
	if err != nil {
		return 0, err
	}
	defer to.Close()

	moved := 0
	var batch []string
	moveBatch := func() error {
		if len(batch) == 0 {
			return nil
		}
		var req []byte
		for _, k := range batch {
			req = append(req, "mg "+k+" v f t k\r\n"...)
		}
		req = append(req, "mn\r\n"...)
		if _, err := from.Write(req); err != nil {
			return err
		}
		sets := []byte{}
		deletes := []byte{}
		for {
			line, err := fromR.ReadSlice('\n')
			if err != nil {
				return err
			}
			if string(line) == "MN\r\n" {
				break
			}
			if strings.HasPrefix(string(line), "EN") { // gone since it was listed
				continue
			}
			// VA <size> f<flags> t<ttl> k<key>
			fields := strings.Fields(string(line))
			size, _ := strconv.Atoi(fields[1])
			flags, ttl, key := fields[2][1:], fields[3][1:], fields[4][1:]
			if ttl == "-1" {
				ttl = "0"
			}
			value := make([]byte, size+2)
			if _, err := io.ReadFull(fromR, value); err != nil {
				return err
			}
			sets = append(sets, "ms "+key+" "+strconv.Itoa(size)+" F"+flags+" T"+ttl+" ME q\r\n"...)
			sets = append(sets, value...)
			deletes = append(deletes, "md "+key+" q\r\n"...)
			moved++
		}
		for _, step := range []struct {
			c   net.Conn
			r   *bufio.Reader
			req []byte
		}{{to, toR, sets}, {from, fromR, deletes}} {
			if _, err := step.c.Write(append(step.req, "mn\r\n"...)); err != nil {
				return err
			}
			for {
				line, err := step.r.ReadSlice('\n')
				if err != nil {
					return err
				}
				if string(line) == "MN\r\n" {
					break
				}
			}
		}
		batch = batch[:0]
		return nil
	}

	if _, err := list.Write([]byte("lru_crawler metadump all\r\n")); err != nil {
		return 0, err
	}
	for {
		line, err := listR.ReadSlice('\n')
		if err != nil {
			return moved, err
		}
		if string(line) == "END\r\n" {
			break
		}
		k, _, _ := strings.Cut(strings.TrimPrefix(string(line), "key="), " ")
		if k, err = url.QueryUnescape(k); err != nil {
			return moved, err
		}
		h := fnv.New32a()
		h.Write([]byte(k))
		if !move || h.Sum32()%4 != 0 {
			continue
		}
		if batch = append(batch, k); len(batch) == 250 {
			if err := moveBatch(); err != nil {
				return moved, err
			}
		}
	}
	return moved, moveBatch()
}
