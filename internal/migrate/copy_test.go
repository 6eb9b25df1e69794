package migrate

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/moxi-proxy/moxi/internal/memstore"
)

// fakeOld is an old server in memory that lists keys k0 to k<keys-1> and holds no value
// for any of them, so that the copy reads every key and adds none; asked counts the keys
// read. Its connections are pipes: inside a synctest bubble, a wait on them is durable.
func fakeOld(keys int, asked *atomic.Int64) Dialer {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		client, server := net.Pipe()
		go func() {
			defer server.Close()
			r, w := bufio.NewReader(server), bufio.NewWriter(server)
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					return // the client closed its end
				}
				switch {
				case strings.HasPrefix(line, "lru_crawler metadump"):
					for i := range keys {
						fmt.Fprintf(w, "key=k%d exp=-1 la=1 cas=1 fetch=no cls=1 size=65\r\n", i)
					}
					w.WriteString("END\r\n")
				case strings.HasPrefix(line, "mg "):
					asked.Add(1)
					w.WriteString("EN\r\n")
				}
				// Answer a pipelined batch once all of it is read: a pipe has no buffer,
				// and the client reads only after its write.
				if r.Buffered() == 0 && w.Flush() != nil {
					return
				}
			}
		}()
		return client, nil
	}
}

// TestCopyKeepsRate: the background copy reads the old server's keys no faster than
// migrate_rate, and no slower: a tenth of a second's keys at once, then the rest at the
// rate. 0 is no limit.
func TestCopyKeepsRate(t *testing.T) {
	const keys = 210
	for _, tc := range []struct {
		name          string
		keysPerSecond int
		want          time.Duration
	}{
		{"unlimited", 0, 0},
		{"100/s: batches of 10", 100, (keys - 10) * time.Second / 100},
		{"1000/s: batches of 100", 1000, (keys - 100) * time.Second / 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var asked atomic.Int64
				m := New(Options{Pool: "p", Name: "s", From: "old", To: "new", New: memstore.New(memstore.Options{}),
					Rate: tc.keysPerSecond, Dial: fakeOld(keys, &asked), Logger: slog.New(slog.DiscardHandler)})
				defer m.Close()
				start := time.Now()
				m.Copy()
				<-m.stopped
				took := time.Since(start)
				if st := m.Status(); st.Phase != Done || st.KeysTotal != keys || asked.Load() != keys {
					t.Fatalf("phase %s, %d keys listed, %d read (%s); want done, %d, %d", st.Phase, st.KeysTotal, asked.Load(), st.Err, keys, keys)
				}
				if d := took - tc.want; d < -time.Millisecond || d > time.Millisecond {
					t.Errorf("the copy took %v, want %v", took, tc.want)
				}
			})
		})
	}
}

// TestStopEndsRateWait: a stop (a reload that took the migration out, or shutdown) ends
// the copy at once, not when its wait for the rate would have ended.
func TestStopEndsRateWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var asked atomic.Int64
		m := New(Options{Pool: "p", Name: "s", From: "old", To: "new", New: memstore.New(memstore.Options{}),
			Rate: 1, Dial: fakeOld(10, &asked), Logger: slog.New(slog.DiscardHandler)}) // batches of 1, a second apart
		defer m.Close()
		m.Copy()
		synctest.Wait() // the copy read its first key and waits a second for the next
		start := time.Now()
		m.StopCopy()
		if took := time.Since(start); took != 0 {
			t.Errorf("the stop took %v, want 0: it must end the wait at once", took)
		}
		if p := m.Phase(); p != Copying || asked.Load() != 1 {
			t.Errorf("phase %s after %d keys read; want %s after 1: a stop neither ends nor fails the migration", p, asked.Load(), Copying)
		}
	})
}
