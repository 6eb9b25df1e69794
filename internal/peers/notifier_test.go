package peers

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakePeer is a peer's POST /invalidate: it records what it took.
type fakePeer struct {
	mu     sync.Mutex
	keys   []string
	flush  int
	tokens []string
	status int
}

func (f *fakePeer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tokens = append(f.tokens, r.Header.Get("Authorization"))
	if f.status != 0 {
		w.WriteHeader(f.status)
		return
	}
	if r.Method != http.MethodPost || r.URL.Path != "/invalidate" {
		w.WriteHeader(http.StatusNotFound)
		return
	}
	if err := ParseLines(body, func(pool string, key []byte) { f.keys = append(f.keys, pool+"/"+string(key)) }, func() { f.flush++ }); err != nil {
		w.WriteHeader(http.StatusBadRequest)
	}
}

func (f *fakePeer) got() ([]string, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.keys...), f.flush
}

// value is a counter's value.
func value(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestInvalidationsReachEveryPeer(t *testing.T) {
	a, b := new(fakePeer), new(fakePeer)
	sa, sb := httptest.NewServer(a), httptest.NewServer(b)
	defer sa.Close()
	defer sb.Close()
	reg := prometheus.NewRegistry()
	n := New(Options{Registry: reg})
	defer n.Close()
	addrA, addrB := strings.TrimPrefix(sa.URL, "http://"), strings.TrimPrefix(sb.URL, "http://")
	n.Set([]string{addrA, addrB}, []byte("tok"))
	for i := range 100 {
		n.Invalidate("main", []byte{'k', byte('0' + i%10)})
	}
	n.FlushAll()
	for _, p := range []*fakePeer{a, b} {
		waitFor(t, "every line at the peer", func() bool { keys, flush := p.got(); return len(keys) == 100 && flush == 1 })
		if p.tokens[0] != "Bearer tok" {
			t.Errorf("the peer got Authorization %q", p.tokens[0])
		}
	}
	// The sender counts a batch once its POST is answered, just after the peer took it.
	waitFor(t, "A's lines counted as sent", func() bool { return value(n.lines.WithLabelValues(addrA, "sent")) == 101 })
}

// TestUnreachablePeerCountedAndBounded: a peer that is gone costs its lines (failed, or
// dropped past the queue's bound) and delays no other peer.
func TestUnreachablePeerCountedAndBounded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // nothing listens there now
	live := new(fakePeer)
	sl := httptest.NewServer(live)
	defer sl.Close()
	n := New(Options{MaxBytes: 4096})
	defer n.Close()
	n.Set([]string{dead, strings.TrimPrefix(sl.URL, "http://")}, []byte("tok"))
	for i := range 2000 {
		n.Invalidate("main", []byte("key-"+strings.Repeat("x", i%20)))
	}
	waitFor(t, "the live peer to get what it was sent", func() bool {
		keys, _ := live.got()
		sent := value(n.lines.WithLabelValues(strings.TrimPrefix(sl.URL, "http://"), "sent"))
		dropped := value(n.lines.WithLabelValues(strings.TrimPrefix(sl.URL, "http://"), "dropped"))
		return float64(len(keys)) == sent && sent+dropped == 2000
	})
	waitFor(t, "the dead peer's lines counted", func() bool {
		failed := value(n.lines.WithLabelValues(dead, "failed"))
		dropped := value(n.lines.WithLabelValues(dead, "dropped"))
		return failed > 0 && failed+dropped == 2000
	})
	n.mu.Lock()
	p := n.peers[dead]
	n.mu.Unlock()
	p.mu.Lock()
	held := len(p.queued)
	p.mu.Unlock()
	if held > 4096 {
		t.Errorf("the dead peer's queue holds %d bytes, bound 4096", held)
	}
}

func TestRefusingPeerCounted(t *testing.T) {
	old := &fakePeer{status: http.StatusNotFound} // a moxi without POST /invalidate
	s := httptest.NewServer(old)
	defer s.Close()
	n := New(Options{})
	defer n.Close()
	addr := strings.TrimPrefix(s.URL, "http://")
	n.Set([]string{addr}, []byte("tok"))
	n.Invalidate("main", []byte("k"))
	waitFor(t, "the refused line counted", func() bool { return value(n.lines.WithLabelValues(addr, "failed")) == 1 })
	n.Set(nil, nil)
	if got := n.Peers(); len(got) != 0 {
		t.Errorf("Peers after Set(nil) = %v", got)
	}
}
