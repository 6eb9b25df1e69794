package backend

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// TestLateWriteChased: a write to a paused memcached times out; resumed, the server applies
// it late. The delete moxi sent after it on the same connection is applied right after it,
// so the late value is never left there — whether the timeout left the server up or marked
// it dead (which closes the connection), and for binary and meta writes.
func TestLateWriteChased(t *testing.T) {
	for _, limit := range []int{1, 100} {
		for _, kind := range []string{"binary", "meta"} {
			t.Run(fmt.Sprintf("%s/failure_limit %d", kind, limit), func(t *testing.T) {
				mc := memcachedtest.Start(t)
				s := newServer(t, mc.Addr, Options{Timeout: 100 * time.Millisecond, FailureLimit: limit})
				check := newServer(t, mc.Addr, Options{})
				write := func(v string) *protocol.Request {
					if kind == "meta" {
						return metaRequest(t, fmt.Sprintf("ms k %d T0\r\n%s\r\n", len(v), v))
					}
					return &protocol.Request{Op: protocol.OpSet, Key: []byte("k"), Value: []byte(v)}
				}
				if r := do(t, s, write("v1")); r.Status != protocol.StatusOK && r.Meta.Code != protocol.MetaHD {
					t.Fatalf("first write: %+v", r)
				}
				mc.Pause(t)
				var resp [1]protocol.Response
				err := pool.Do(context.Background(), s, nil, write("v2"), resp[:])
				if err == nil {
					t.Fatalf("a write to a paused server was answered: %+v", resp[0])
				}
				if err := mc.Signal(syscall.SIGCONT); err != nil {
					t.Fatal(err)
				}
				// The late write lands on resume, and its chase right after it: k reads v1
				// (before), maybe v2 for the moment between the two, then nothing, for good.
				get := &protocol.Request{Op: protocol.OpGet, Keys: keys("k")}
				deadline := time.Now().Add(10 * time.Second)
				for misses := 0; misses < 50; {
					r := do(t, check, get)
					misses++
					if r.Status == protocol.StatusOK {
						misses = 0
						if time.Now().After(deadline) {
							t.Fatalf("10 s after the resume k = %q, want it deleted after the late write", r.Value)
						}
					}
				}
			})
		}
	}
}
