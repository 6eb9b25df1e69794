package migrate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moxi-proxy/moxi/internal/itemcopy"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/writeguard"
)

// A Rebuild refills a server of a replicated pool that came back empty (memcached restarted,
// or moxi flushed it) from the pool's other servers, in the background: every key they list
// (metadump) that belongs on the server is read there and copied to it with add and its
// remaining TTL, at most Rate keys/s. Clients keep working meanwhile, and their reads repair
// what they touch first.
//
// The interleavings it guards against, for one key k: the copy reads v1 from a source; a
// client's write of v2 then lands on both servers — the add of v1 then finds v2 and stores
// nothing; a client's delete of k lands on both — the add would resurrect v1, so the source
// is read again after the add and k deleted on the target when the source no longer has it;
// a write through this proxy in flight between the read and the add — the add is made only
// when no write of k's stripe began or ended since the read (writeguard.IfQuietAll).
//
// One proxy of a tier rebuilds: each takes the lock, a key added on the server itself with
// a TTL (kept alive while copying), and the one whose add stores it copies. The others
// watch the lock until it says done, and take over if it expires first (its holder died).
type Rebuild struct {
	opts    RebuildOptions
	sources []*oldServer

	copied  atomic.Int64
	total   atomic.Int64
	phase   atomic.Pointer[string]
	mu      sync.Mutex // started, finished, err, holder
	started time.Time
	// finished is when the copy ended (or the lock said another proxy's did).
	finished  time.Time
	err       error
	elsewhere bool // another proxy of the tier held the lock and copied

	stop    context.CancelFunc
	stopped chan struct{}
}

// RebuildOptions describe one rebuild.
type RebuildOptions struct {
	Pool, Name string      // the pool, and the rebuild's name (rebuild-<n>)
	Server     string      // the refilled server's name
	To         string      // its address
	Target     pool.Server // the refilled server; owned by the caller
	From       []string    // the addresses of the servers that hold its keys' other copies
	// Holds reports whether a key belongs on the target (it is one of the key's replicas).
	Holds func(key []byte) bool
	// Lock is the tier lock's key: every proxy of the tier names the same one for the same
	// restart (the server's start instant is in it).
	Lock string
	// Predecessor is the lock holder (LockOwner) of the process this one took over from
	// (an upgrade in place), when it was running this rebuild: its hold is this one's.
	Predecessor string
	Rate        int           // keys per second; 0 = no limit
	Timeout     time.Duration // per request; default 1s
	MaxValue    int
	Dial        Dialer
	Writes      *writeguard.Guard // the process's writes (nil: none to wait for)
	Logger      *slog.Logger
}

// rebuildLockTTL is the tier lock's TTL in seconds: a holder renews it every third of it,
// so a holder that died lets another proxy take over within it. The lock stays "done" for
// doneTTL after the copy, so that a proxy that saw the restart late does not copy again.
const (
	rebuildLockTTL = 30
	rebuildDoneTTL = 3600
	lockDone       = "done"
)

// lockPoll is how often a proxy that does not hold the lock looks at it.
const lockPoll = time.Second

// NewRebuild prepares a rebuild; Start begins it.
func NewRebuild(opts RebuildOptions) *Rebuild {
	if opts.Timeout <= 0 {
		opts.Timeout = time.Second
	}
	if opts.MaxValue <= 0 {
		opts.MaxValue = protocol.DefaultLimits().MaxValueBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	r := &Rebuild{opts: opts}
	for _, addr := range opts.From {
		r.sources = append(r.sources, newOldServer(addr, 2, opts.Timeout, opts.MaxValue, opts.Dial))
	}
	phase := Copying
	r.phase.Store(&phase)
	return r
}

// Start begins the rebuild in the background; Stop ends it.
func (r *Rebuild) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	r.stop, r.stopped = cancel, make(chan struct{})
	r.mu.Lock()
	r.started = time.Now()
	r.mu.Unlock()
	go func() {
		defer close(r.stopped)
		r.run(ctx)
	}()
}

// Stop ends the rebuild (shutdown, or a reload that took the server out) and closes its
// connections.
func (r *Rebuild) Stop() {
	if r.stop != nil {
		r.stop()
		<-r.stopped
	}
	for _, o := range r.sources {
		o.close()
	}
}

// Done reports whether the rebuild has ended, done or failed.
func (r *Rebuild) Done() bool { p := *r.phase.Load(); return p == Done || p == Failed }

// Status reports the rebuild's progress as /migrations lists it: from the servers it
// copies from to the one it refills.
func (r *Rebuild) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := Status{
		Pool: r.opts.Pool, Name: r.opts.Name, Server: r.opts.Server, From: strings.Join(r.opts.From, ","), To: r.opts.To,
		Phase: *r.phase.Load(), KeysCopied: r.copied.Load(), KeysTotal: r.total.Load(),
		Started: r.started, Finished: r.finished,
	}
	if r.err != nil {
		st.Err = r.err.Error()
	}
	return st
}

func (r *Rebuild) run(ctx context.Context) {
	log := r.opts.Logger.With("pool", r.opts.Pool, "server", r.opts.Server, "rebuild", r.opts.Name)
	held, err := r.takeLock(ctx, log)
	switch {
	case ctx.Err() != nil:
		log.Info("rebuild stopped before its end", "keys_copied", r.copied.Load())
		return
	case err != nil:
		r.finish(log, err)
		return
	case !held:
		r.finish(log, nil) // another proxy of the tier copied it
		return
	}
	renew, stopRenew := context.WithCancel(ctx)
	defer stopRenew()
	go r.renewLock(renew)
	log.Info("rebuild started: the server came back empty; copying its keys from the other replicas", "from", r.opts.From, "rate", r.opts.Rate)
	limit := copyLimiter(r.opts.Rate) // one for every source: Rate bounds the whole rebuild
	for _, src := range r.sources {
		l := lister{
			old: src, moves: r.opts.Holds, total: &r.total,
			copy: func(ctx context.Context, batch [][]byte) error { return r.copyBatch(ctx, src, batch) },
			progress: func() {
				log.Info("rebuild progress", "keys_copied", r.copied.Load(), "keys_listed", r.total.Load())
			},
		}
		if err = l.run(ctx, limit); err != nil {
			break
		}
	}
	stopRenew()
	if ctx.Err() != nil {
		log.Info("rebuild stopped before its end", "keys_copied", r.copied.Load())
		return
	}
	if err == nil {
		err = r.setLock(ctx, lockDone, rebuildDoneTTL)
	}
	r.finish(log, err)
}

func (r *Rebuild) finish(log *slog.Logger, err error) {
	phase := Done
	r.mu.Lock()
	r.finished, r.err = time.Now(), err
	elsewhere := r.elsewhere
	r.mu.Unlock()
	if err != nil {
		phase = Failed
	}
	r.phase.Store(&phase)
	args := []any{"keys_copied", r.copied.Load(), "keys_listed", r.total.Load(), "took", time.Since(r.started).Round(time.Millisecond)}
	switch {
	case err != nil:
		log.Error("rebuild failed; reads repair the keys they find missing", append(args, "err", err.Error())...)
	case elsewhere:
		log.Info("rebuild done by another proxy of the tier (its lock)", args...)
	default:
		log.Info("rebuild done", args...)
	}
}

// copyBatch reads keys from src and adds each found to the target, unless a write of it
// through this proxy began since the read (those that did not wait for the add); then
// reads the source again and deletes on the
// target the keys it no longer holds (a client's delete between the read and the add).
func (r *Rebuild) copyBatch(ctx context.Context, src *oldServer, keys [][]byte) error {
	epochs := make([]uint64, len(keys))
	if r.opts.Writes != nil {
		for i, k := range keys {
			epochs[i] = r.opts.Writes.Settled(k)
		}
	}
	items, err := src.get(ctx, keys)
	if err != nil {
		return err
	}
	quiet := make([]bool, len(keys))
	release := func() {}
	if r.opts.Writes != nil {
		quiet, release = r.opts.Writes.HoldQuiet(keys, epochs)
	} else {
		for i := range quiet {
			quiet[i] = true
		}
	}
	var adds []protocol.Request
	var added [][]byte
	for i := range items {
		if it := &items[i]; it.Found && quiet[i] {
			if exptime, ok := itemcopy.Exptime(it.TTL); ok {
				adds = append(adds, itemcopy.Store(protocol.OpAdd, keys[i], it, exptime))
				added = append(added, keys[i])
			}
		}
	}
	if len(adds) > 0 {
		resps, errs := make([]protocol.Response, len(adds)), make([]error, len(adds))
		pool.DoBatch(ctx, r.opts.Target, nil, adds, resps, errs)
		for i := range adds {
			if errs[i] != nil {
				err = errs[i]
				break
			}
			if resps[i].Status == protocol.StatusOK {
				r.copied.Add(1)
			}
		}
	}
	release()
	if err != nil || len(added) == 0 {
		return err
	}
	again, err := src.get(ctx, added)
	if err != nil {
		return err
	}
	var dels []protocol.Request
	for i, it := range again {
		if !it.Found {
			dels = append(dels, itemcopy.Delete(added[i]))
		}
	}
	if len(dels) == 0 {
		return nil
	}
	resps, errs := make([]protocol.Response, len(dels)), make([]error, len(dels))
	pool.DoBatch(ctx, r.opts.Target, nil, dels, resps, errs)
	return errors.Join(errs...)
}

// takeLock takes the tier lock, or waits while another proxy holds it: true when this
// proxy is to copy; false once the holder marked it done.
func (r *Rebuild) takeLock(ctx context.Context, log *slog.Logger) (bool, error) {
	owner := LockOwner()
	for logged := false; ; {
		add := protocol.Request{Op: protocol.OpAdd, Key: []byte(r.opts.Lock), Value: []byte(owner), Exptime: rebuildLockTTL}
		var resp [1]protocol.Response
		if err := pool.Do(ctx, r.opts.Target, nil, &add, resp[:]); err != nil {
			return false, fmt.Errorf("the rebuild lock: %w", err)
		}
		if resp[0].Status == protocol.StatusOK {
			return true, nil
		}
		get := protocol.Request{Op: protocol.OpGet, Keys: [][]byte{[]byte(r.opts.Lock)}}
		if err := pool.Do(ctx, r.opts.Target, nil, &get, resp[:]); err != nil {
			return false, fmt.Errorf("the rebuild lock: %w", err)
		}
		if resp[0].Status == protocol.StatusOK {
			holder := string(resp[0].Value)
			r.mu.Lock()
			r.elsewhere = true
			r.mu.Unlock()
			if holder == lockDone {
				return false, nil
			}
			if r.opts.Predecessor != "" && holder == r.opts.Predecessor {
				// Copied again from the start (add: no harm), under this process's name.
				return true, r.setLock(ctx, owner, rebuildLockTTL)
			}
			if !logged {
				logged = true
				log.Info("rebuild: another proxy of the tier holds the lock and copies", "holder", holder)
			}
		}
		select {
		case <-time.After(lockPoll):
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

// renewLock keeps the lock alive while the copy runs.
func (r *Rebuild) renewLock(ctx context.Context) {
	tick := time.NewTicker(rebuildLockTTL * time.Second / 3)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			_ = r.setLock(ctx, LockOwner(), rebuildLockTTL)
		case <-ctx.Done():
			return
		}
	}
}

func (r *Rebuild) setLock(ctx context.Context, value string, ttl int64) error {
	set := protocol.Request{Op: protocol.OpSet, Key: []byte(r.opts.Lock), Value: []byte(value), Exptime: ttl}
	var resp [1]protocol.Response
	return pool.Do(ctx, r.opts.Target, nil, &set, resp[:])
}

// LockOwner names this process in the lock: host and pid, for the logs of the others.
func LockOwner() string {
	host, _ := os.Hostname()
	return host + ":" + strconv.Itoa(os.Getpid())
}
