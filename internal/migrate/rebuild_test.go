package migrate

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
	"github.com/moxi-proxy/moxi/internal/memstore"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/writeguard"
)

// fillText sets keys on the memcached at addr, pipelined, each to "v-<key>".
func fillText(t *testing.T, addr string, keys []string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "set %s 0 0 %d\r\nv-%s\r\n", k, len(k)+2, k)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	for range keys {
		if line, err := r.ReadString('\n'); err != nil || line != "STORED\r\n" {
			t.Fatalf("set: %q %v", line, err)
		}
	}
}

// held is whether target holds key with the value fillText gave it.
func held(t *testing.T, target pool.Server, key string) bool {
	t.Helper()
	var resp [1]protocol.Response
	if err := pool.Do(context.Background(), target, nil, &protocol.Request{Op: protocol.OpGet, Keys: [][]byte{[]byte(key)}}, resp[:]); err != nil {
		t.Fatal(err)
	}
	return resp[0].Status == protocol.StatusOK && string(resp[0].Value) == "v-"+key
}

// waitDone polls until r has ended, for up to 30 s.
func waitDone(t *testing.T, r *Rebuild) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(30 * time.Second); !r.Done(); <-tick.C {
		if time.Now().After(deadline) {
			t.Fatalf("not done after 30 s: %+v", r.Status())
		}
	}
}

// TestRebuildCopiesItsKeys: two servers hold keys, some of which belong on the target too;
// the rebuild copies exactly those, from each server, except one whose write through this
// proxy was in flight when it was read; and it takes the tier's lock, leaving it "done".
func TestRebuildCopiesItsKeys(t *testing.T) {
	a, b := memcachedtest.Start(t), memcachedtest.Start(t)
	belongs := func(k []byte) bool { n, _ := strconv.Atoi(strings.TrimPrefix(string(k), "k:")); return n%3 == 0 }
	var onA, onB []string
	for i := range 3000 {
		k := "k:" + strconv.Itoa(i)
		if i%2 == 0 {
			onA = append(onA, k)
		} else {
			onB = append(onB, k)
		}
	}
	fillText(t, a.Addr, onA)
	fillText(t, b.Addr, onB)
	target := memstore.New(memstore.Options{})
	var writes writeguard.Guard
	writes.Begin([]byte("k:0")) // a write of k:0 in flight: its copy must not land
	r := NewRebuild(RebuildOptions{Pool: "p", Name: "rebuild-1", Server: "t", To: "embedded", Target: target,
		From: []string{a.Addr, b.Addr}, Holds: belongs, Lock: "__moxi__:rebuild:1", Writes: &writes})
	r.Start()
	defer r.Stop()
	waitDone(t, r)
	writes.End([]byte("k:0"))
	want := 0 // the keys that belong, but those whose writes count as k:0's
	for i := 0; i < 3000; i += 3 {
		if !writeguard.Shares([]byte("k:"+strconv.Itoa(i)), []byte("k:0")) {
			want++
		}
	}
	st := r.Status()
	if st.Phase != Done || st.KeysCopied != int64(want) || st.KeysTotal != 1000 {
		t.Errorf("status %+v; want done, %d of 1,000 keys copied", st, want)
	}
	for i := range 3000 {
		k := "k:" + strconv.Itoa(i)
		if want := i%3 == 0 && !writeguard.Shares([]byte(k), []byte("k:0")); held(t, target, k) != want {
			t.Errorf("%s on the target: %v, want %v", k, !want, want)
		}
	}
	var resp [1]protocol.Response
	_ = pool.Do(context.Background(), target, nil, &protocol.Request{Op: protocol.OpGet, Keys: [][]byte{[]byte("__moxi__:rebuild:1")}}, resp[:])
	if string(resp[0].Value) != lockDone {
		t.Errorf("the lock holds %q after the rebuild, want %q", resp[0].Value, lockDone)
	}

	// A second proxy of the tier, late: it finds the lock done and copies nothing.
	again := NewRebuild(RebuildOptions{Pool: "p", Name: "rebuild-1", Server: "t", To: "embedded", Target: target,
		From: []string{a.Addr, b.Addr}, Holds: belongs, Lock: "__moxi__:rebuild:1"})
	again.Start()
	defer again.Stop()
	waitDone(t, again)
	if st := again.Status(); st.Phase != Done || st.KeysCopied != 0 || st.KeysTotal != 0 {
		t.Errorf("a rebuild whose lock another proxy marked done: %+v; want done, nothing copied", st)
	}
}

// TestRebuildWaitsForTheLockHolder: while another proxy holds the lock, a rebuild copies
// nothing and is not done; once the holder marks it done, it is.
func TestRebuildWaitsForTheLockHolder(t *testing.T) {
	a := memcachedtest.Start(t)
	fillText(t, a.Addr, []string{"k:0", "k:3"})
	target := memstore.New(memstore.Options{})
	lock := func(v string) {
		var resp [1]protocol.Response
		_ = pool.Do(context.Background(), target, nil, &protocol.Request{Op: protocol.OpSet, Key: []byte("L"), Value: []byte(v), Exptime: 60}, resp[:])
	}
	lock("other-proxy:1")
	r := NewRebuild(RebuildOptions{Pool: "p", Name: "rebuild-1", Server: "t", To: "embedded", Target: target,
		From: []string{a.Addr}, Holds: func([]byte) bool { return true }, Lock: "L"})
	r.Start()
	defer r.Stop()
	// Three of its looks at the lock: it copies nothing and goes on waiting.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(3 * lockPoll); time.Now().Before(end); <-tick.C {
		if r.Done() || held(t, target, "k:0") {
			t.Fatalf("a rebuild went on while another proxy held the lock: %+v", r.Status())
		}
	}
	lock(lockDone)
	waitDone(t, r)
	if st := r.Status(); st.Phase != Done || st.KeysCopied != 0 {
		t.Errorf("%+v; want done by the holder, nothing copied here", st)
	}
}
