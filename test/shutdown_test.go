package test

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// TestSIGTERMAnswersPipelinedRequests: clients that pipelined 10 requests each (sets with
// and without noreply, gets) through a slow link when SIGTERM arrives get every answer, and
// every write they sent lands, before moxi closes their connections.
func TestSIGTERMAnswersPipelinedRequests(t *testing.T) {
	mc := memcachedtest.Start(t)
	link := startForwarder(t, mc.Addr, 100*time.Millisecond) // 200 ms round trip
	conf := writeConfig(t, slowPool(link.addr(), ""))
	moxi := startMoxi(t, "--config", conf)

	const clients, perClient = 8, 10
	conns := make([]net.Conn, clients)
	var want []string
	for c := range clients {
		nc, err := net.Dial("tcp", moxi.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		conns[c] = nc
		var pipeline strings.Builder
		var answers []string
		for i := range perClient {
			key := fmt.Sprintf("term:%d:%d", c, i)
			switch i % 3 {
			case 0:
				fmt.Fprintf(&pipeline, "set %s 0 0 1\r\nv\r\n", key)
				answers = append(answers, "STORED")
			case 1:
				fmt.Fprintf(&pipeline, "set %s 0 0 1 noreply\r\nw\r\n", key)
				want = append(want, key)
			case 2:
				fmt.Fprintf(&pipeline, "get term:%d:%d\r\n", c, i-2)
				answers = append(answers, "VALUE", "v", "END")
			}
		}
		if _, err := nc.Write([]byte(pipeline.String())); err != nil {
			t.Fatal(err)
		}
		defer func() {
			r := bufio.NewReader(nc)
			_ = nc.SetReadDeadline(time.Now().Add(20 * time.Second))
			for j, w := range answers {
				line, err := r.ReadString('\n')
				if err != nil {
					t.Errorf("client %d: answer line %d: %v (want %q)", c, j, err, w)
					return
				}
				if !strings.HasPrefix(strings.TrimSuffix(line, "\r\n"), w) {
					t.Errorf("client %d: answer line %d %q, want %q", c, j, line, w)
				}
			}
			if _, err := r.ReadString('\n'); err == nil {
				t.Errorf("client %d: connection still open after the answers", c)
			}
		}()
	}
	// The signal arrives once moxi has read the pipelines: their first sets reached
	// memcached, and the rest are behind them on the slow link. The answers are read by the
	// deferred checks, after moxi began to stop.
	waitUntil(t, time.Now(), 20*time.Second, func() bool {
		var sets int
		fmt.Sscan(memcachedtest.Stats(t, mc.Addr)["cmd_set"], &sets)
		return sets >= clients
	})
	if err := moxi.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The noreply writes landed too.
		d, err := dialText(mc.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		for _, key := range want {
			if v, err := d.get(key); err != nil || v != "w" {
				t.Errorf("noreply set of %s sent before SIGTERM: %q %v", key, v, err)
			}
		}
	})
}
