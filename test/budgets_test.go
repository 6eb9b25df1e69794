package test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// rssBound is the peak RSS, in MiB, that moxi must stay under with the default 64 MiB
// byte budgets, however many large values a client sends or reads.
const rssBound = 256

// budgetValue is the bigValue-byte value stored as key: the key, then filler, so that a
// value read back is known to be key's own.
func budgetValue(key string) []byte {
	v := bytes.Repeat([]byte{'x'}, bigValue)
	copy(v, key)
	return v
}

// setBig sends a set of key = budgetValue(key) on nc and reads the answer line, all within
// timeout.
func setBig(nc net.Conn, r *bufio.Reader, key string, timeout time.Duration) (string, error) {
	_ = nc.SetDeadline(time.Now().Add(timeout))
	if _, err := fmt.Fprintf(nc, "set %s 0 0 %d\r\n%s\r\n", key, bigValue, budgetValue(key)); err != nil {
		return "", err
	}
	return r.ReadString('\n')
}

// getBig reads key on nc and reports whether it holds budgetValue(key).
func getBig(nc net.Conn, r *bufio.Reader, key string) (bool, error) {
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(nc, "get %s\r\n", key); err != nil {
		return false, err
	}
	line, err := r.ReadString('\n')
	if err != nil || line == "END\r\n" {
		return false, err
	}
	if line != fmt.Sprintf("VALUE %s 0 %d\r\n", key, bigValue) {
		return false, fmt.Errorf("get %s: %q", key, line)
	}
	v := make([]byte, bigValue+len("\r\nEND\r\n"))
	if _, err := io.ReadFull(r, v); err != nil {
		return false, err
	}
	return bytes.Equal(v[:bigValue], budgetValue(key)) && string(v[bigValue:]) == "\r\nEND\r\n", nil
}

// TestFireAndForgetBoundedInBytes: with the fire-and-forget pool's memcached paused,
// 1 MiB fire-and-forget sets from a few clients are acknowledged only while their bytes fit
// max_pending_bytes (64 MiB by default); then they wait, and moxi's peak RSS stays within
// rssBound. Once the server resumes, every acknowledged set lands.
func TestFireAndForgetBoundedInBytes(t *testing.T) {
	const (
		sets, clients = 3000, 4
		maxAcked      = 100 // 64 MiB of 1 MiB writes, and one a client in flight, with room to spare
		// A set not acknowledged in this long waits for room: its client stops.
		stall = 2 * time.Second
	)
	mc := memcachedtest.Start(t, "-I", "2m", "-m", "1024")
	// The pool's timeout outlasts the pause, so the queued writes wait for the server
	// rather than fail and make room.
	moxi := startMoxiBin(t, fastMoxi(t), "--config", writeConfig(t, fmt.Sprintf(
		"pools:\n  main:\n    timeout: 1m\n    servers: [%s]\nfire_and_forget:\n  prefixes: [\"ff:\"]\n", mc.Addr)))
	if err := mc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := mc.Signal(syscall.SIGCONT); err != nil {
				t.Error(err)
			}
		}
	}
	defer resume()

	var mu sync.Mutex
	var acked []string
	conns := make([]net.Conn, clients)
	for w := range conns {
		nc, err := net.Dial("tcp", moxi.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		conns[w] = nc
	}
	deadline := time.Now().Add(10 * time.Second)
	start := time.Now()
	var wg sync.WaitGroup
	for w, nc := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := bufio.NewReader(nc)
			for i := w; i < sets && time.Now().Before(deadline); i += clients {
				key := "ff:" + strconv.Itoa(i)
				line, err := setBig(nc, r, key, stall)
				if err != nil {
					return // waiting for room: the queue is full
				}
				if line != "STORED\r\n" {
					t.Errorf("fire-and-forget set %s: %q", key, line)
					return
				}
				mu.Lock()
				acked = append(acked, key)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	peak := peakRSS(t, moxi.cmd.Process.Pid)
	t.Logf("memcached paused: %d of %d 1 MiB fire-and-forget sets acknowledged in %v (bound %d); moxi's peak RSS %.0f MiB (bound %d MiB)",
		len(acked), sets, time.Since(start).Round(time.Millisecond), maxAcked, peak, rssBound)
	if len(acked) > maxAcked {
		t.Errorf("%d sets of 1 MiB acknowledged while the server was paused; want ≤ %d (max_pending_bytes 64 MiB)", len(acked), maxAcked)
	}
	if len(acked) == 0 {
		t.Error("no fire-and-forget set was acknowledged while the server was paused")
	}
	if peak > rssBound {
		t.Errorf("peak RSS %.0f MiB with max_pending_bytes 64 MiB; want ≤ %d MiB", peak, rssBound)
	}

	resume()
	resumedAt := time.Now()
	missing := ""
	landed := poll(time.Minute, func() bool {
		d, err := net.Dial("tcp", mc.Addr)
		if err != nil {
			return false
		}
		defer d.Close()
		dr := bufio.NewReader(d)
		for _, key := range acked {
			if ok, err := getBig(d, dr, key); !ok || err != nil {
				missing = key
				return false
			}
		}
		return true
	})
	if !landed {
		t.Fatalf("an acknowledged set never landed after the server resumed: %s", missing)
	}
	t.Logf("all %d acknowledged sets landed within %v of the server resuming", len(acked), time.Since(resumedAt).Round(time.Millisecond))
}
