// Package migrate copies a pool's items between memcached servers in the background while
// clients keep working. A Migration moves one ring slot's data from an old memcached to a
// new one: writes go to the new server (and delete the key on the old one), reads that miss
// on the new server are answered from the old one and copied over, and a background copier
// moves everything else. A Rebuild refills a replica that came back empty from the others.
package migrate

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moxi-proxy/moxi/internal/itemcopy"
	"github.com/moxi-proxy/moxi/internal/keyhash"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/turn"
)

var _ pool.Server = (*Migration)(nil)

// Options describe one migration.
type Options struct {
	Pool, Name string      // the slot
	From, To   string      // the old server's address, the new one's
	New        pool.Server // the new server; owned by the caller, who closes it
	// At, when set, is the instant every proxy of a tier switches the slot to New (its
	// migrate_at). Until then Old, the server that served the slot before, serves it
	// exactly as before, and nothing is copied; the copy starts Settle after At.
	At       time.Time
	Old      pool.Server   // required with At; owned by the caller, who closes it
	Rate     int           // keys per second the background copy may move; 0 = no limit
	Timeout  time.Duration // per request to the old server; default 1s
	MaxValue int           // largest value read from the old server; 0 = protocol.DefaultLimits
	Dial     Dialer        // opens connections to the old server; nil = plain TCP
	Logger   *slog.Logger

	// Moves, when set, picks the keys of the old server that the background copy moves:
	// a reshard moves only the keys whose server is now the new one (nil: every key).
	Moves func(key []byte) bool
	// DeleteMoved makes the background copy delete each key it moves on the old server
	// once the new one has it, so that a later change moving the key back finds no old
	// copy there (a reshard: the old server keeps serving its other keys).
	DeleteMoved bool
}

// oldRetryAfter is how long reads leave the old server alone after it failed one.
const oldRetryAfter = time.Second

// Settle is how long after migrate_at the background copy starts: by then every proxy of
// the tier has switched (clocks agree within it) and the requests they sent OLD before the
// switch have been answered or timed out. Until the copy starts, reads of keys missing on
// the new server still go to OLD, so nothing is lost meanwhile.
const Settle = 2 * time.Second

// Phases of a migration.
const (
	Scheduled = "scheduled" // migrate_at has not come: OLD serves the slot as before
	Copying   = "copying"
	Done      = "done"
	Failed    = "failed"
)

// Status is a migration's progress.
type Status struct {
	Pool, Name, From, To string
	Server               string // a rebuild's: the name of the server it refills
	Phase                string
	KeysCopied           int64 // copied by the background copy or by reads
	KeysTotal            int64 // listed on the old server so far
	Started, Finished    time.Time
	Err                  string
}

// Migration is one slot being moved. It is the slot's server while it lasts (a
// pool.Server), and safe for concurrent use.
//
// The interleavings it guards against, for one key k: a copy (background or read-through)
// reads v1 from the old server, then a client's write of v2 or delete of k is acknowledged,
// then the copy adds v1 to the new server — reverting the write or resurrecting the delete.
// So a write of k and a copy of k hold k's stripe lock, every write marks k touched, and a
// copy of a touched key is not made: once a client wrote k through moxi, only the client's
// writes decide its value.
type Migration struct {
	opts Options
	old  *oldServer

	phase    atomic.Pointer[string]
	copied   atomic.Int64
	total    atomic.Int64
	mu       sync.Mutex // started, finished, err
	started  time.Time
	finished time.Time
	err      error

	oldDownUntil atomic.Int64 // unix nanos: until then, reads do not consult the old server
	switched     atomic.Bool  // migrate_at has passed (or there is none)

	stripes   keyhash.Stripes[sync.Mutex]
	touchedMu sync.Mutex
	touched   map[string]struct{} // keys written through moxi since the migration began

	stop    context.CancelFunc
	stopped chan struct{}  // closed when the copier has exited
	adding  sync.WaitGroup // read-through copies made after their answer
}

// New prepares a migration; Start begins the background copy.
func New(opts Options) *Migration {
	if opts.Timeout <= 0 {
		opts.Timeout = time.Second
	}
	if opts.MaxValue <= 0 {
		opts.MaxValue = protocol.DefaultLimits().MaxValueBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	m := &Migration{opts: opts, old: newOldServer(opts.From, 4, opts.Timeout, opts.MaxValue, opts.Dial), touched: make(map[string]struct{})}
	phase := Copying
	m.phase.Store(&phase)
	m.switched.Store(opts.At.IsZero())
	return m
}

// scheduled reports whether migrate_at is still ahead: the slot is OLD's, as before.
func (m *Migration) scheduled() bool {
	if m.switched.Load() {
		return false
	}
	if time.Now().Before(m.opts.At) {
		return true
	}
	m.switched.Store(true)
	return false
}

// Copy begins the background copy; Stop ends it.
func (m *Migration) Copy() {
	ctx, cancel := context.WithCancel(context.Background())
	m.stop, m.stopped = cancel, make(chan struct{})
	m.mu.Lock()
	m.started = time.Now()
	m.mu.Unlock()
	if m.opts.At.IsZero() {
		m.opts.Logger.Info("migration started", "pool", m.opts.Pool, "server", m.opts.Name, "from", m.opts.From, "to", m.opts.To, "rate", m.opts.Rate)
	} else {
		m.opts.Logger.Info("migration scheduled", "pool", m.opts.Pool, "server", m.opts.Name, "from", m.opts.From, "to", m.opts.To, "rate", m.opts.Rate,
			"migrate_at", m.opts.At, "copy_from", m.opts.At.Add(Settle))
	}
	go func() {
		defer close(m.stopped)
		if !m.opts.At.IsZero() {
			wait := time.NewTimer(time.Until(m.opts.At.Add(Settle)))
			defer wait.Stop()
			select {
			case <-wait.C:
			case <-ctx.Done():
				return
			}
			m.mu.Lock()
			m.started = time.Now()
			m.mu.Unlock()
		}
		m.run(ctx)
	}()
}

// StopCopy ends the background copy (a reload took the migration out, or shutdown). The
// migration still answers requests, for those in flight on the old topology.
func (m *Migration) StopCopy() {
	if m.stop != nil {
		m.stop()
		<-m.stopped
	}
}

// Close closes the connections to the old server, once no request uses the migration. The
// new server is not closed: it outlives the migration, and its owner closes it.
func (m *Migration) Close() error {
	m.StopCopy()
	m.adding.Wait()
	m.old.close()
	return nil
}

// Phase is scheduled, copying, done or failed.
func (m *Migration) Phase() string {
	if m.scheduled() {
		return Scheduled
	}
	return *m.phase.Load()
}

// serving is the server the slot is, to failover and the admin views: OLD while scheduled,
// then the new one.
func (m *Migration) serving() pool.Server {
	if m.scheduled() {
		return m.opts.Old
	}
	return m.opts.New
}

// ReadsFrom is the old server's address while reads of the slot go to it: all of them while
// scheduled, those the new server misses while copying (or after a failed copy); "" once
// the copy is done.
func (m *Migration) ReadsFrom() string {
	if m.Phase() == Done {
		return ""
	}
	return m.opts.From
}

// Up is the serving server's health: while its slot migrates, failover treats the slot as
// its new server.
func (m *Migration) Up() bool { return m.serving().Up() }

// Info is the serving server's, its state "migrating" while the copy runs and the server is
// up.
func (m *Migration) Info() pool.Info {
	info := m.serving().Info()
	if info.State == pool.StateUp && m.Phase() == Copying {
		info.State = pool.StateMigrating
	}
	return info
}

// Stats are the serving server's "stats proxy" lines.
func (m *Migration) Stats() []protocol.Stat { return m.serving().Stats() }

// Status reports the migration's progress.
func (m *Migration) Status() Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := Status{
		Pool: m.opts.Pool, Name: m.opts.Name, From: m.opts.From, To: m.opts.To,
		Phase: m.Phase(), KeysCopied: m.copied.Load(), KeysTotal: m.total.Load(),
		Started: m.started, Finished: m.finished,
	}
	if m.err != nil {
		st.Err = m.err.Error()
	}
	return st
}

func (m *Migration) finish(phase string, err error) {
	m.mu.Lock()
	m.finished, m.err = time.Now(), err
	m.mu.Unlock()
	m.phase.Store(&phase)
	args := []any{"pool", m.opts.Pool, "server", m.opts.Name, "from", m.opts.From, "to", m.opts.To,
		"keys_copied", m.copied.Load(), "keys_listed", m.total.Load(), "took", time.Since(m.started).Round(time.Millisecond)}
	if err != nil {
		m.opts.Logger.Error("migration failed", append(args, "err", err.Error())...)
		return
	}
	m.opts.Logger.Info("migration done", args...)
	m.touchedMu.Lock()
	m.touched = nil // only needed while copying
	m.touchedMu.Unlock()
	m.old.close() // done: nothing reads the old server again (a removed server is let go)
}

// Start answers requests for the slot: while scheduled, the old server's; once the copy is
// done, the new server's, passed on; while copying, one request after the other under
// its key's rules (do), on a goroutine that waits.
func (m *Migration) Start(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error, done func()) {
	switch {
	case m.scheduled():
		m.opts.Old.Start(ctx, order, reqs, resps, errs, done)
	case m.Phase() == Done:
		m.opts.New.Start(ctx, order, reqs, resps, errs, done)
	default:
		pool.StartWaiting(ctx, order, reqs, resps, errs, done, m.do)
	}
}

// do answers one request for the slot.
func (m *Migration) do(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response) error {
	if m.scheduled() {
		return pool.Do(ctx, m.opts.Old, order, req, resps)
	}
	if m.Phase() == Done {
		return pool.Do(ctx, m.opts.New, order, req, resps)
	}
	switch {
	case req.Op == protocol.OpGet || req.Op == protocol.OpGets:
		return m.read(ctx, order, req, resps)
	case req.Op.IsWrite(), req.Op == protocol.OpMetaSet, req.Op == protocol.OpMetaDelete, req.Op == protocol.OpMetaArithmetic:
		return m.write(ctx, order, req, resps)
	case req.Op == protocol.OpGat || req.Op == protocol.OpGats:
		for _, k := range req.Keys { // a touch: the old copy's TTL would be wrong now
			m.markTouched(k)
		}
		return pool.Do(ctx, m.opts.New, order, req, resps)
	case req.Op == protocol.OpFlushAll:
		err := pool.Do(ctx, m.opts.New, order, req, resps)
		if err == nil {
			var old [1]protocol.Response
			_ = m.old.with(ctx, m.opts.Timeout, func(c *textConn) error { return flushOld(c, req.Exptime, &old[0]) })
		}
		return err
	default:
		return pool.Do(ctx, m.opts.New, order, req, resps)
	}
}

// write sends a write to the new server and deletes the key on the old one, under the
// key's stripe lock, so that no copy of the old value can land after it.
func (m *Migration) write(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response) error {
	mu := m.stripes.Of(req.Key)
	mu.Lock()
	defer mu.Unlock()
	m.markTouched(req.Key)
	if err := pool.Do(ctx, m.opts.New, order, req, resps); err != nil {
		return err
	}
	found, err := m.old.delete(ctx, req.Key)
	if err != nil {
		// The write stands on the new server, and no read consults the old one for a
		// touched key, so answering is safe; the old server keeps a stale copy, which
		// matters only if the migration is reverted.
		m.opts.Logger.Warn("migration: delete on the old server failed", "server", m.opts.Name, "from", m.opts.From, "err", err)
	}
	if found {
		deletedThere(req, &resps[0])
	}
	return nil
}

// deletedThere makes a delete's answer of the new server (resp) what memcached answers
// for a key it held, when the old server held it: the key was in the slot, not yet copied.
func deletedThere(req *protocol.Request, resp *protocol.Response) {
	switch {
	case req.Op == protocol.OpDelete && resp.Status == protocol.StatusNotFound:
		resp.Status = protocol.StatusOK
	case req.Op == protocol.OpMetaDelete && resp.Meta.Code == protocol.MetaNF:
		resp.Status, resp.Meta.Code = protocol.StatusOK, protocol.MetaHD
	}
}

// read answers from the new server, and keys it misses from the old one, copying each hit
// over with add (it never overwrites a newer value) and its remaining TTL.
func (m *Migration) read(ctx context.Context, order *turn.Turn, req *protocol.Request, resps []protocol.Response) error {
	if err := pool.Do(ctx, m.opts.New, order, req, resps); err != nil {
		return err
	}
	var missed [][]byte
	var at []int
	for i := range resps {
		if resps[i].Status == protocol.StatusNotFound {
			missed, at = append(missed, req.Keys[i]), append(at, i)
		}
	}
	for j, it := range m.ReadMissed(ctx, missed) {
		if it.Found {
			resps[at[j]] = protocol.Response{Key: req.Keys[at[j]], Value: it.Value, Flags: it.Flags}
		}
	}
	return nil
}

// ReadMissed reads keys that missed on the new server from the old one: what it found, each
// copied to the new server after the answer. When the old server fails, the misses stand
// (a correct answer) and for a while reads do not wait for it again. A reshard's server
// asks it directly for the keys of a multi-get whose old servers differ.
func (m *Migration) ReadMissed(ctx context.Context, keys [][]byte) []itemcopy.Item {
	if len(keys) == 0 || m.Phase() == Done || time.Now().UnixNano() < m.oldDownUntil.Load() {
		return make([]itemcopy.Item, len(keys))
	}
	items, err := m.copyKeys(ctx, keys, true)
	if err != nil {
		m.oldDownUntil.Store(time.Now().Add(oldRetryAfter).UnixNano())
		m.opts.Logger.Warn("migration: the old server did not answer a read; misses stand", "server", m.opts.Name, "from", m.opts.From, "err", err, "retry_in", oldRetryAfter)
		return make([]itemcopy.Item, len(keys))
	}
	if m.opts.DeleteMoved {
		m.recheck(ctx, keys, items)
	}
	return items
}

// recheck reads again from the new server the keys the old one did not have: the
// background copy may have moved them there, and deleted them on the old one, between the
// read that missed on the new server and the read of the old.
func (m *Migration) recheck(ctx context.Context, keys [][]byte, items []itemcopy.Item) {
	var ask [][]byte
	var at []int
	for j, it := range items {
		if !it.Found {
			ask, at = append(ask, keys[j]), append(at, j)
		}
	}
	if len(ask) == 0 {
		return
	}
	get := protocol.Request{Op: protocol.OpGet, Keys: ask}
	resps := make([]protocol.Response, len(ask))
	if pool.Do(ctx, m.opts.New, nil, &get, resps) != nil { // on no client's order: the client's read has its answer already
		return
	}
	for i := range resps {
		if resps[i].Status == protocol.StatusOK {
			items[at[i]] = itemcopy.Item{Found: true, Value: resps[i].Value, Flags: resps[i].Flags}
		}
	}
}

// copyKeys copies keys from the old server to the new one, skipping any a client has
// written, and returns what it found (Found false for touched or missing keys). With
// later, the adds are made in the background, after the answer: a read-through then costs
// the reader two round trips, not three. Either way an add happens under the key's stripe
// lock and only if no client has written the key since, so it cannot land after a write.
func (m *Migration) copyKeys(ctx context.Context, keys [][]byte, later bool) ([]itemcopy.Item, error) {
	locks := m.lockStripes(keys)
	var ask [][]byte
	var at []int
	for i, k := range keys {
		if !m.isTouched(k) {
			ask, at = append(ask, k), append(at, i)
		}
	}
	out := make([]itemcopy.Item, len(keys))
	if len(ask) == 0 {
		unlockAll(locks)
		return out, nil
	}
	items, err := m.old.get(ctx, ask)
	if err != nil {
		unlockAll(locks)
		return nil, err
	}
	for j, it := range items {
		out[at[j]] = it
	}
	if !later {
		defer unlockAll(locks)
		return out, m.addAll(ctx, ask, items)
	}
	unlockAll(locks)
	// The keys belong to the client's request, which ends with the answer: the adds that
	// outlive it use copies.
	owned := make([][]byte, len(ask))
	for i, k := range ask {
		owned[i] = bytes.Clone(k)
	}
	ask = owned
	m.adding.Add(1)
	go func() {
		defer m.adding.Done()
		locks := m.lockStripes(ask)
		defer unlockAll(locks)
		for j, k := range ask {
			if m.isTouched(k) {
				items[j].Found = false // written since we read it: the client's write decides
			}
		}
		_ = m.addAll(context.Background(), ask, items)
	}()
	return out, nil
}

// addAll adds every found item to the new server, as one batch (the backend pipelines
// it: one round trip). Its caller holds the keys' stripe locks.
func (m *Migration) addAll(ctx context.Context, keys [][]byte, items []itemcopy.Item) error {
	var adds []protocol.Request
	for j := range items {
		if it := &items[j]; it.Found {
			if exptime, ok := itemcopy.Exptime(it.TTL); ok {
				adds = append(adds, itemcopy.Store(protocol.OpAdd, keys[j], it, exptime))
			}
		}
	}
	if len(adds) == 0 {
		return nil
	}
	resps, errs := make([]protocol.Response, len(adds)), make([]error, len(adds))
	pool.DoBatch(ctx, m.opts.New, nil, adds, resps, errs) // on no client's order: the stripe locks order it
	for i := range adds {
		if errs[i] != nil {
			return errs[i]
		}
		if resps[i].Status == protocol.StatusOK {
			m.copied.Add(1)
		}
	}
	return nil
}

func (m *Migration) markTouched(k []byte) {
	m.touchedMu.Lock()
	if m.touched != nil {
		m.touched[string(k)] = struct{}{}
	}
	m.touchedMu.Unlock()
}

func (m *Migration) isTouched(k []byte) bool {
	m.touchedMu.Lock()
	defer m.touchedMu.Unlock()
	_, ok := m.touched[string(k)]
	return ok
}

// lockStripes locks the stripes of keys in ascending order, so that two callers locking
// overlapping sets cannot deadlock.
func (m *Migration) lockStripes(keys [][]byte) []*sync.Mutex {
	idx := make([]int, 0, len(keys))
	for _, k := range keys {
		idx = append(idx, keyhash.Stripe(k, len(m.stripes)))
	}
	slices.Sort(idx)
	idx = slices.Compact(idx)
	locks := make([]*sync.Mutex, len(idx))
	for i, s := range idx {
		locks[i] = &m.stripes[s]
		locks[i].Lock()
	}
	return locks
}

func unlockAll(locks []*sync.Mutex) {
	for _, l := range locks {
		l.Unlock()
	}
}
