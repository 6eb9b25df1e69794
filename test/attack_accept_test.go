//go:build accept

package test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// TestAcceptAttackUnreadAnswers: clients that pipeline hundreds of gets of a 1 MB value and never
// read the answers hold at most max_connection_bytes each in moxi (4 MiB), not the 300 MB
// they asked for.
func TestAcceptAttackUnreadAnswers(t *testing.T) {
	t.Parallel() // what it measures is moxi's own memory, whatever else runs
	mc := memcachedtest.Start(t, "-m", "1024")
	storeAttackValue(t, mc.Addr)

	const gets = 300
	text := bytes.Repeat([]byte("get big\r\n"), gets)
	bin := bytes.Repeat(binaryRequest(0x00, "big", nil, 0), gets) // GET
	for _, tc := range []struct {
		name  string
		conns int
		reqs  []byte
	}{
		{"text, 1 connection", 1, text},
		{"text, 4 connections", 4, text},
		{"text, 8 connections", 8, text},
		{"binary, 4 connections", 4, bin},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runSiege(t, mc.Addr, siege{conns: tc.conns, dur: 4 * time.Second, attack: unreadAnswers(tc.reqs)})
		})
	}
}

// TestAcceptAttackHalfSentRequests: clients that start requests and never finish them — set
// headers announcing 1 MB followed by a trickle of the value, get lines whose keys go on and
// on — cost moxi what they have sent, within max_buffered_bytes (64 MiB) for all of them
// together, not what they announce.
func TestAcceptAttackHalfSentRequests(t *testing.T) {
	t.Parallel() // mostly waits on trickling clients; what it measures is moxi's own memory
	mc := memcachedtest.Start(t, "-m", "1024")
	storeAttackValue(t, mc.Addr)

	// 6.4 KB every 100 ms: 64 KB/s per connection, so a 1 MB value never completes.
	valueChunk := bytes.Repeat([]byte("v"), 6400)
	keys := keyChunk(166, 240) // 40 KB of " key": a 2.4 MB line in 6 s at one chunk per 100 ms
	const line = 2_400_000     // under the longest get line moxi accepts (10000 keys of 250 bytes)
	for _, tc := range []struct {
		name   string
		conns  int
		dur    time.Duration
		attack attackFunc
	}{
		{"text set values, 2000 connections", 2000, 8 * time.Second, trickle(
			func(i int) []byte { return fmt.Appendf(nil, "set half:%d 0 0 %d\r\n", i, attackValue) },
			valueChunk, attackValue-1, 100*time.Millisecond)},
		{"binary set values, 1000 connections", 1000, 8 * time.Second, trickle(
			func(i int) []byte {
				return binaryRequest(0x01, fmt.Sprintf("half:%d", i), make([]byte, 8), attackValue) // SET, flags and expiry 0
			},
			valueChunk, attackValue-1, 100*time.Millisecond)},
		{"get lines, 500 connections", 500, 8 * time.Second, trickle(
			func(int) []byte { return []byte("get") }, keys, line, 100*time.Millisecond)},
		{"2 MB get lines, 150 connections", 150, 6 * time.Second, trickle(
			func(int) []byte { return []byte("get") }, keys, 2_000_000, 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := fileLimit(t, tc.conns)
			runSiege(t, mc.Addr, siege{conns: n, dur: tc.dur, attack: tc.attack})
		})
	}
}

// unreadAnswers sends reqs at once and then reads nothing until the attack ends.
func unreadAnswers(reqs []byte) attackFunc {
	return func(ctx context.Context, _ int, nc net.Conn) error {
		_ = nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if _, err := nc.Write(reqs); err != nil {
			return fmt.Errorf("sending the requests: %w", err)
		}
		<-ctx.Done()
		return nil
	}
}

// trickle sends head(i), then chunk after chunk, one every `every` (0: as fast as moxi
// reads), until limit bytes follow the head, and holds the connection until the attack
// ends: the request is never complete. A write that meets its deadline, moxi not reading,
// is not an error; the next one goes on.
func trickle(head func(i int) []byte, chunk []byte, limit int, every time.Duration) attackFunc {
	return func(ctx context.Context, i int, nc net.Conn) error {
		_ = nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if _, err := nc.Write(head(i)); err != nil {
			return fmt.Errorf("sending the head: %w", err)
		}
		var tick <-chan time.Time
		step := 200 * time.Millisecond // a write's deadline
		if every > 0 {
			tk := time.NewTicker(every)
			defer tk.Stop()
			tick, step = tk.C, every
		}
		sent := 0
		for n := 0; sent < limit && n < 1_000_000; n++ {
			if tick != nil {
				select {
				case <-ctx.Done():
					return nil
				case <-tick:
				}
			} else if ctx.Err() != nil {
				return nil
			}
			_ = nc.SetWriteDeadline(time.Now().Add(step))
			w, err := nc.Write(chunk[:min(len(chunk), limit-sent)])
			sent += w
			if err != nil && !isTimeout(err) {
				return fmt.Errorf("after %d bytes: %w", sent, err)
			}
		}
		<-ctx.Done()
		return nil
	}
}

// keyChunk is n keys of size bytes, each after a space: a piece of a get line.
func keyChunk(n, size int) []byte {
	var b bytes.Buffer
	for k := range n {
		key := fmt.Sprintf("key:%d:", k)
		b.WriteString(" " + key + strings.Repeat("k", size-len(key)))
	}
	return b.Bytes()
}
