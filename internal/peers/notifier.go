package peers

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of Options.
const (
	DefaultMaxBytes = 1 << 20         // queued per peer
	DefaultTimeout  = 1 * time.Second // one POST
	maxBackoff      = time.Second     // between attempts at a peer that failed
)

// Options configure a Notifier.
type Options struct {
	MaxBytes int                   // lines queued per peer; past it lines are dropped (counted). 0: DefaultMaxBytes
	Timeout  time.Duration         // one POST. 0: DefaultTimeout
	Registry prometheus.Registerer // moxi_peer_invalidations_total goes here; nil: not exported
	Logger   *slog.Logger          // nil: slog.Default()
}

// Notifier sends each peer the keys written through this moxi, as soon as they are queued:
// a sender per peer, so that a peer that is slow or gone delays no other. A peer that
// cannot be reached misses its lines (counted) and keeps its entries for its hot cache's
// ttl at most. Safe for concurrent use.
type Notifier struct {
	opts   Options
	client *http.Client
	lines  *prometheus.CounterVec
	logger *slog.Logger

	mu     sync.Mutex
	token  []byte
	peers  map[string]*peer // by admin address
	wg     sync.WaitGroup
	active atomic.Int32 // len(peers): writes cost nothing while there are none
}

// peer is one peer's queue and sender.
type peer struct {
	addr string
	n    *Notifier
	stop chan struct{}
	kick chan struct{} // buffered 1: lines are queued

	mu      sync.Mutex
	queued  []byte // whole lines
	lines   int    // in queued
	dropped int    // lines dropped for room since the last count
}

// New returns a Notifier with no peers (Set gives them).
func New(opts Options) *Notifier {
	opts.MaxBytes = cmp.Or(opts.MaxBytes, DefaultMaxBytes)
	opts.Timeout = cmp.Or(opts.Timeout, DefaultTimeout)
	n := &Notifier{
		opts:   opts,
		client: &http.Client{Timeout: opts.Timeout, Transport: &http.Transport{MaxIdleConnsPerHost: maxInFlight}},
		logger: cmp.Or(opts.Logger, slog.Default()),
		peers:  map[string]*peer{},
		lines: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "moxi_peer_invalidations_total",
			Help: "Invalidation lines (a key written through this moxi, or a flush_all) for a peer's hot cache, by result: sent (the peer took them), failed (it could not be reached, or refused them: it keeps its entries up to its hot cache's ttl), dropped (its queue was full).",
		}, []string{"peer", "result"}),
	}
	if opts.Registry != nil {
		opts.Registry.MustRegister(n.lines)
	}
	return n
}

// Set makes addrs (admin addresses, host:port) the peers, presenting token: a new peer's
// sender starts, a removed one's stops (what it had queued is dropped).
func (n *Notifier) Set(addrs []string, token []byte) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.token = slices.Clone(token)
	for addr, p := range n.peers {
		if !slices.Contains(addrs, addr) {
			close(p.stop)
			delete(n.peers, addr)
			for _, r := range []string{"sent", "failed", "dropped"} {
				n.lines.DeleteLabelValues(addr, r)
			}
		}
	}
	for _, addr := range addrs {
		if n.peers[addr] != nil {
			continue
		}
		p := &peer{addr: addr, n: n, stop: make(chan struct{}), kick: make(chan struct{}, 1)}
		for _, r := range []string{"sent", "failed", "dropped"} {
			n.lines.WithLabelValues(addr, r)
		}
		n.peers[addr] = p
		n.wg.Add(1)
		go p.send()
	}
	n.active.Store(int32(len(n.peers)))
}

// Peers are the peers' addresses, sorted.
func (n *Notifier) Peers() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]string, 0, len(n.peers))
	for addr := range n.peers {
		out = append(out, addr)
	}
	slices.Sort(out)
	return out
}

// Invalidate queues key of pool for every peer.
func (n *Notifier) Invalidate(pool string, key []byte) {
	if n.active.Load() == 0 {
		return
	}
	var line [256]byte
	n.queue(AppendKey(line[:0], pool, key))
}

// FlushAll queues, for every peer, the line that empties its hot cache.
func (n *Notifier) FlushAll() { n.queue(AppendFlushAll(nil)) }

func (n *Notifier) queue(line []byte) {
	if n.active.Load() == 0 {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range n.peers {
		p.mu.Lock()
		if len(p.queued)+len(line) > n.opts.MaxBytes {
			p.dropped++
		} else {
			p.queued = append(p.queued, line...)
			p.lines++
		}
		p.mu.Unlock()
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
}

// Close stops every sender and waits for them.
func (n *Notifier) Close() {
	n.Set(nil, nil)
	n.wg.Wait()
	n.client.CloseIdleConnections()
}

// maxInFlight bounds the POSTs to one peer at once: lines queued while one is answered go
// in the next at once, not after it, so that a slow answer does not delay the keys behind it.
const maxInFlight = 4

// send posts p's queued lines as they come, up to maxInFlight batches at once. After a
// failure it waits (doubling, up to maxBackoff) before trying again, so that a peer that is
// gone costs little.
func (p *peer) send() {
	defer p.n.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-p.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	slots := make(chan struct{}, maxInFlight)
	var posts sync.WaitGroup
	defer posts.Wait()
	var mu sync.Mutex // guards backoff
	backoff := time.Duration(0)
	for {
		select {
		case <-p.stop:
			return
		case <-p.kick:
		}
		mu.Lock()
		wait := backoff
		mu.Unlock()
		if wait > 0 {
			select {
			case <-p.stop:
				return
			case <-time.After(wait):
			}
		}
		select {
		case <-p.stop:
			return
		case slots <- struct{}{}:
		}
		p.mu.Lock()
		body := p.queued
		p.queued = nil
		lines, dropped := p.lines, p.dropped
		p.lines, p.dropped = 0, 0
		p.mu.Unlock()
		if dropped > 0 {
			p.n.lines.WithLabelValues(p.addr, "dropped").Add(float64(dropped))
		}
		if lines == 0 {
			<-slots
			continue
		}
		posts.Go(func() {
			defer func() { <-slots }()
			err := p.post(ctx, body)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				p.n.lines.WithLabelValues(p.addr, "failed").Add(float64(lines))
				if backoff == 0 {
					p.n.logger.Warn("a peer did not take invalidations: it keeps its hot cache entries up to their ttl", "peer", p.addr, "err", err)
				}
				backoff = min(max(2*backoff, 50*time.Millisecond), maxBackoff)
				select { // lines queued meanwhile go after the backoff
				case p.kick <- struct{}{}:
				default:
				}
				return
			}
			if backoff != 0 {
				p.n.logger.Info("a peer takes invalidations again", "peer", p.addr)
			}
			backoff = 0
			p.n.lines.WithLabelValues(p.addr, "sent").Add(float64(lines))
		})
	}
}

func (p *peer) post(ctx context.Context, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+p.addr+"/invalidate", bytes.NewReader(body))
	if err != nil {
		return err
	}
	p.n.mu.Lock()
	token := p.n.token
	p.n.mu.Unlock()
	req.Header.Set("Authorization", "Bearer "+string(token))
	req.Header.Set("Content-Type", "application/x-ndjson")
	resp, err := p.n.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST /invalidate: %s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}
