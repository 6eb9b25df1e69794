package test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// bigValue is the size of each value of the large multi-gets: 1 MiB, memcached's item
// size limit for the value alone (memcached runs with -I 2m so that it fits).
const bigValue = 1 << 20

// storeBig writes n values of bigValue bytes, keys big:0 … big:n-1, straight to memcached.
func storeBig(t *testing.T, addr string, n int) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	r := bufio.NewReader(nc)
	value := bytes.Repeat([]byte{'x'}, bigValue)
	for i := range n {
		_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(nc, "set big:%d 0 0 %d\r\n", i, bigValue)
		nc.Write(value)
		nc.Write([]byte("\r\n"))
		if line, err := r.ReadString('\n'); err != nil || line != "STORED\r\n" {
			t.Fatalf("set big:%d: %q %v", i, line, err)
		}
	}
}

// bigGet asks for keys big:0 … big:n-1 in one get and reads the whole answer, returning
// the values received or the first line that was not a value.
func bigGet(addr string, n int) (int, error) {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	var line strings.Builder
	line.WriteString("get")
	for i := range n {
		fmt.Fprintf(&line, " big:%d", i)
	}
	line.WriteString("\r\n")
	_ = nc.SetDeadline(time.Now().Add(2 * time.Minute))
	if _, err := io.WriteString(nc, line.String()); err != nil {
		return 0, err
	}
	r := bufio.NewReaderSize(nc, 64<<10)
	values := 0
	for {
		l, err := r.ReadString('\n')
		if err != nil {
			return values, err
		}
		if l == "END\r\n" {
			return values, nil
		}
		f := strings.Fields(l)
		if len(f) != 4 || f[0] != "VALUE" {
			return values, fmt.Errorf("after %d values: %q", values, l)
		}
		size, _ := strconv.Atoi(f[3])
		if _, err := r.Discard(size + 2); err != nil {
			return values, err
		}
		values++
	}
}

// peakRSS is the peak resident set size of process pid, in MiB.
func peakRSS(t *testing.T, pid int) float64 { return float64(procStatus(t, pid, "VmHWM")) / 1024 }

// TestLargeMultiGet: multi-gets of hundreds of 1 MiB values, with the default timeouts,
// complete; the server is never taken for dead, a small client beside them sees no error,
// and moxi's memory stays bounded — the answer is streamed part by part, not held whole.
// The RSS bounds are measured on moxi built without the race detector, whose shadow memory
// would swamp them.
func TestLargeMultiGet(t *testing.T) {
	mc := memcachedtest.Start(t, "-I", "2m", "-m", "1400")
	storeBig(t, mc.Addr, 1000)
	config := writeConfig(t, fmt.Sprintf("pools:\n  main:\n    servers: [%s]\n", mc.Addr)) // default timeouts

	// run makes clients multi-gets of keys values at once, checks them, and returns moxi's
	// peak RSS in MiB.
	run := func(t *testing.T, keys, clients int) float64 {
		admin := freeAddr(t)
		moxi := startMoxiBin(t, fastMoxi(t), "--config", config, "--admin", admin)
		before := peakRSS(t, moxi.cmd.Process.Pid)

		stop := make(chan struct{})
		var small sync.WaitGroup
		var smallErrs []string
		var smallOps int
		small.Add(1)
		go func() {
			defer small.Done()
			c, err := dialText(moxi.addr)
			if err != nil {
				smallErrs = append(smallErrs, err.Error())
				return
			}
			defer c.Close()
			for i := 0; i < 1_000_000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ans, err := c.set("small:"+strconv.Itoa(i%50), "v")
				if err == nil && ans == "STORED" {
					ans, err = c.get("small:" + strconv.Itoa(i%50))
				}
				smallOps++
				if err != nil || ans != "v" {
					smallErrs = append(smallErrs, fmt.Sprintf("%q %v", ans, err))
				}
			}
		}()

		start := time.Now()
		var wg sync.WaitGroup
		results := make([]error, clients)
		got := make([]int, clients)
		for i := range clients {
			wg.Add(1)
			go func() { defer wg.Done(); got[i], results[i] = bigGet(moxi.addr, keys) }()
		}
		wg.Wait()
		took := time.Since(start)
		close(stop)
		small.Wait()

		for i, err := range results {
			if err != nil || got[i] != keys {
				t.Errorf("client %d: %d of %d values, %v", i, got[i], keys, err)
			}
		}
		if len(smallErrs) > 0 {
			t.Errorf("the small client beside the big gets saw %d errors in %d operations, first %s", len(smallErrs), smallOps, smallErrs[0])
		}
		servers := getText(t, "http://"+admin+"/servers")
		if !strings.Contains(servers, `"state": "up"`) {
			t.Errorf("server not up after the big gets: %s", servers)
		}
		if n := counterValue(t, admin, `moxi_backend_errors_total{kind="timeout",pool="main",server="`+mc.Addr+`"}`); n != 0 {
			t.Errorf("%v timeouts counted against a healthy server", n)
		}
		peak := peakRSS(t, moxi.cmd.Process.Pid)
		t.Logf("%d × get of %d × 1 MiB: %v; small client %d ops; moxi peak RSS %.0f MiB (%.0f MiB before)", clients, keys, took.Round(time.Millisecond), smallOps, peak, before)
		return peak
	}
	bounded := func(t *testing.T, keys, clients int, bound float64) {
		peak := run(t, keys, clients)
		if peak > bound {
			// On a machine starved of CPU by other work, the GC can fall behind values
			// arriving at GB/s and the heap overshoot its goal for a moment (238 MiB once
			// in a full run, against 60 to 80 MiB usually). Moxi holding answers whole
			// would exceed the bound every time, by far (1 GiB and more): a second
			// measurement, with a fresh moxi, tells the two apart.
			t.Logf("peak RSS %.0f MiB over %.0f MiB: measuring again", peak, bound)
			peak = run(t, keys, clients)
		}
		if peak > bound {
			t.Errorf("moxi peak RSS %.0f MiB, want ≤ %.0f MiB", peak, bound)
		}
	}
	t.Run("one 300 MiB answer", func(t *testing.T) { bounded(t, 300, 1, 150) })
	t.Run("three at once", func(t *testing.T) { bounded(t, 300, 3, 200) })
	t.Run("1000 keys", func(t *testing.T) { run(t, 1000, 1) })
}
