package backend

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// metaRequest decodes one meta command line (and data block) as a client would send it.
func metaRequest(t *testing.T, wire string) *protocol.Request {
	t.Helper()
	r := protocol.NewTextReader(bufio.NewReader(strings.NewReader(wire)), protocol.DefaultLimits())
	req := new(protocol.Request)
	if err := r.Read(req); err != nil {
		t.Fatalf("%q: %v", wire, err)
	}
	return req
}

// TestMetaConcurrent: many meta requests at once share the server's meta connections and
// each gets its own answer.
func TestMetaConcurrent(t *testing.T) {
	mc := memcachedtest.Start(t)
	s := newServer(t, mc.Addr, Options{Connections: 2, Timeout: 5 * time.Second})
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 200 {
		key, value := fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i)
		set := metaRequest(t, fmt.Sprintf("ms %s %d T0\r\n%s\r\n", key, len(value), value))
		get := metaRequest(t, fmt.Sprintf("mg %s v k\r\n", key))
		wg.Add(1)
		go func() {
			defer wg.Done()
			var r [1]protocol.Response
			if err := pool.Do(context.Background(), s, nil, set, r[:]); err != nil || r[0].Meta.Code != protocol.MetaHD {
				errs <- fmt.Errorf("ms %s: %+v %v", key, r[0], err)
				return
			}
			if err := pool.Do(context.Background(), s, nil, get, r[:]); err != nil || string(r[0].Value) != value || string(r[0].Meta.Flags) != " k"+key {
				errs <- fmt.Errorf("mg %s: %q %q %v", key, r[0].Value, r[0].Meta.Flags, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestMetaSilentServer: a server that accepts and never answers times a meta request out
// after about Timeout, and the next request gets a fresh connection.
func TestMetaSilentServer(t *testing.T) {
	s := newServer(t, memcachedtest.Blackhole(t), Options{Connections: 1, Timeout: 200 * time.Millisecond, FailureLimit: 100})
	for range 2 {
		var r [1]protocol.Response
		err := pool.Do(context.Background(), s, nil, metaRequest(t, "mg k v\r\n"), r[:])
		if !errors.Is(err, ErrTimeout) {
			t.Fatalf("mg to a silent server: %v, want a timeout", err)
		}
	}
}
