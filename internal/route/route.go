// Package route composes servers: the features of a pool that act around its servers'
// answers — a backup pool, a warm_from pool, a shadow pool — are pool.Servers that wrap each
// member's server, composed when the topology is built (as mcrouter composes route
// handles). The proxy routes, splits and gathers; what else happens to a request on its way
// to a member's server, and after its answer, is decided here.
package route

import (
	"context"
	"errors"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"

	"github.com/moxi-proxy/moxi/internal/bgqueue"
	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/writeguard"
)

// Options configure a Shared. The zero value of each field is usable.
type Options struct {
	// MaxBackgroundBytes bounds the backup copies and shadow requests queued at once, in
	// bytes; past it they are dropped. 0 = the config's default.
	MaxBackgroundBytes int
	Registry           prometheus.Registerer // where the features' metrics go; nil = not exported
	Logger             *slog.Logger          // nil = slog.Default()
}

// Shared is what the composed servers of every topology share, one per process: the
// background queues and their byte budget, the counters, and the writes in flight, which
// make warm-up copies safe across reloads (warmup.go).
type Shared struct {
	// Writes is the process's guard of writes by key (writeguard.Guard). The proxy begins and
	// ends every write in it, before and after its server's answer; warm-up copies and
	// replicated pools (topology.Builder passes it on) read it.
	Writes writeguard.Guard

	// Backup counts the backup reads and copies; "stats reset" zeroes it.
	Backup      BackupCounters
	backupGuard backupGuard // which keys the backup pools may answer (backup.go)

	// background holds the bytes of the backup copies and shadow requests queued or being
	// sent (max_background_bytes); one budget for both, so neither starves moxi's memory.
	background *semaphore.Weighted
	mirrors    *bgqueue.Queue[*pool.Pool] // writes to copy to backup pools (backup.go)
	shadows    *bgqueue.Queue[shadowTo]   // requests for shadow pools (shadow.go)

	warmSkip       warmSkip               // keys never to read from a warm_from pool (warmup.go)
	warmReads      *prometheus.CounterVec // moxi_warmup_reads_total{pool,result}
	shadowRequests *prometheus.CounterVec // moxi_shadow_requests_total{pool,result}
	replicaRepairs *prometheus.CounterVec // moxi_replica_repairs_total{pool}
	zoneReads      *prometheus.CounterVec // moxi_zone_reads_total{pool,zone,result}
}

// Background is the max_background_bytes budget, which replica writes answered before
// every replica took them share with backup copies and shadow requests (pool.Options).
func (s *Shared) Background() *semaphore.Weighted { return s.background }

// ReplicaRepaired is what a replicated pool calls for each copy a read makes to a replica
// that missed (pool.Options.Repaired): it counts in moxi_replica_repairs_total{pool}.
func (s *Shared) ReplicaRepaired(pool string) func() {
	c := s.replicaRepairs.WithLabelValues(pool)
	return c.Inc
}

// ZoneRead is what a pool with zones calls for each key a read answers
// (replica.Options.ZoneRead): it counts in moxi_zone_reads_total{pool,zone,result}.
func (s *Shared) ZoneRead(pool string) func(zone, result string) {
	return func(zone, result string) { s.zoneReads.WithLabelValues(pool, zone, result).Inc() }
}

// NewShared returns the shared state of a process's composed servers.
func NewShared(opts Options) *Shared {
	if opts.MaxBackgroundBytes <= 0 {
		opts.MaxBackgroundBytes = config.Default().Limits.MaxBackgroundBytes
	}
	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	s := &Shared{background: semaphore.NewWeighted(int64(opts.MaxBackgroundBytes))}
	s.mirrors, s.shadows = s.newMirrors(opts.MaxBackgroundBytes), s.newShadows(opts.MaxBackgroundBytes)
	s.warmReads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moxi_warmup_reads_total",
		Help: "Keys that missed on a pool with warm_from and were read from that pool, by pool (the one warming up) and result (hit, miss).",
	}, []string{"pool", "result"})
	s.shadowRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moxi_shadow_requests_total",
		Help: "Requests copied to a pool's shadow pool, by pool (the one shadowed) and result: ok (answered), error (not answered), dropped (the shadow queue was full).",
	}, []string{"pool", "result"})
	b := &s.Backup
	counter := func(name, help string, v func() uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v()) })
	}
	s.replicaRepairs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moxi_replica_repairs_total",
		Help: "Copies made to a replica that missed a key another replica held (pools with replicas), by pool.",
	}, []string{"pool"})
	s.zoneReads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moxi_zone_reads_total",
		Help: "Keys read from a pool with zones, by pool, zone and result: local (a hit in this proxy's zone, the zone named), remote (a hit in another zone, the one named), miss (in every zone asked; the zone named is this proxy's).",
	}, []string{"pool", "zone", "result"})
	reg.MustRegister(s.warmReads, s.shadowRequests, s.replicaRepairs, s.zoneReads,
		counter("moxi_backup_reads_total", "Keys that missed or failed on their pool and were asked of its backup pool.", b.Reads.Load),
		counter("moxi_backup_hits_total", "Keys the backup pool answered with a value.", b.Hits.Load),
		counter("moxi_backup_writes_total", "Writes copied to a backup pool.", b.Writes.Load),
		counter("moxi_backup_write_errors_total", "Writes the backup pool did not answer.", b.WriteErrors.Load),
		counter("moxi_backup_writes_dropped_total", "Writes not copied to a backup pool because too many copies, or max_background_bytes of them, were in flight.", b.WritesDropped.Load),
	)
	return s
}

// Close waits for the copies to backup pools and sends what is queued for shadow pools, or
// gives up when ctx ends (what is left of them is then cancelled). Requests must have
// stopped before.
func (s *Shared) Close(ctx context.Context) error {
	return errors.Join(s.mirrors.Close(ctx), s.shadows.Close(ctx))
}

// Features are the pools a pool's members' servers are composed with (package topology's
// Stack, layers 5 to 7); a nil pool is no such feature.
type Features struct {
	Backup   *pool.Pool // writes are copied there; a get that misses or fails is asked there
	WarmFrom *pool.Pool // a read that misses is read there and copied here
	Shadow   *pool.Pool // ShadowFraction of the keys' requests are copied there
	// ShadowFraction is the share of keys shadowed, chosen by key hash.
	ShadowFraction float64
}

// WithWarmUp is next, member i's server of pl, warmed up from from (warm_from): a read that
// misses is read there and copied here. next itself when from is nil.
func (s *Shared) WithWarmUp(pl *pool.Pool, i int, from *pool.Pool, next pool.Server) pool.Server {
	if from == nil {
		return next
	}
	s.warmReads.WithLabelValues(pl.Name(), "hit")
	s.warmReads.WithLabelValues(pl.Name(), "miss")
	return &warmUp{wrapped: wrapped{next}, s: s, pool: pl.Name(), self: pl.Member(i), from: from}
}

// WithBackup is next with a backup pool, to: writes are copied there, and a get that misses or
// fails is asked there. next itself when to is nil.
func (s *Shared) WithBackup(to *pool.Pool, next pool.Server) pool.Server {
	if to == nil {
		return next
	}
	return &backup{wrapped: wrapped{next}, s: s, to: to}
}

// WithShadow is next, a server of pl, shadowed to to: fraction of the keys' requests are
// copied there. next itself when to is nil or fraction 0.
func (s *Shared) WithShadow(pl, to *pool.Pool, fraction float64, next pool.Server) pool.Server {
	if to == nil || fraction <= 0 {
		return next
	}
	for _, r := range shadowResultNames {
		s.shadowRequests.WithLabelValues(pl.Name(), r)
	}
	return &shadow{wrapped: wrapped{next}, s: s, to: shadowTo{pool: to, from: pl.Name()}, fraction: fraction}
}

// wrapped is what a composed server passes on to the server it wraps unchanged: its health,
// counters and statistics (it has none of its own). Close does nothing: the topology's
// builder, which made the wrapped server, closes it.
type wrapped struct{ next pool.Server }

func (w wrapped) Up() bool               { return w.next.Up() }
func (w wrapped) Info() pool.Info        { return w.next.Info() }
func (w wrapped) Stats() []protocol.Stat { return w.next.Stats() }
func (w wrapped) Close() error           { return nil }
