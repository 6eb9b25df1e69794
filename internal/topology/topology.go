// Package topology builds the proxy's routing table from a config, reusing the running
// servers that the new config leaves unchanged, so that a reload keeps their connections,
// their health and (for embedded shards) their data.
package topology

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moxi-proxy/moxi/internal/backend"
	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/hotcache"
	"github.com/moxi-proxy/moxi/internal/memstore"
	"github.com/moxi-proxy/moxi/internal/migrate"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/route"
	"github.com/moxi-proxy/moxi/internal/tlsfiles"
	"github.com/moxi-proxy/moxi/internal/turn"
)

// Builder makes topologies and owns the servers they use. Safe for concurrent use, though
// reloads are serialized by the caller.
type Builder struct {
	Logger *slog.Logger
	// Dial false makes remote servers placeholders that never connect (for --check).
	Dial bool
	// Latency, when set, gets each remote server's answer times, labelled pool and server.
	Latency *prometheus.HistogramVec
	// Features is what the servers composed with a pool's backup, warm_from and shadow
	// pools share (package route); nil = one of the Builder's own, made by the first Build.
	Features *route.Shared

	mu         sync.Mutex
	standIns   *pool.StandIns                      // shared by every pool built; made by the first Build
	running    map[serverKey]pool.Server           // the servers of the committed topology
	migrations map[migrationKey]*migrate.Migration // its migrations
	retired    sync.WaitGroup                      // servers closing after their grace
}

// migrationKey identifies a migration: the same slot moving between the same servers.
type migrationKey struct {
	pool, name, from, to string
	at                   time.Time   // migrate_at: another instant is another schedule
	server               pool.Server // the new server itself: new settings mean a new server, and a new copy
}

// serverKey is a server's identity: two configs that give the same key share the server.
// Anything that changes how moxi talks to it is part of the key.
type serverKey struct {
	pool, addr, name    string
	embeddedIndex       int
	embeddedMB          int
	connections         int
	connectTimeout      time.Duration
	timeout             time.Duration
	failureLimit        int
	backoff, backoffMax time.Duration
	limits              protocol.Limits
	tls                 tlsfiles.Sum // what the pool's TLS files held: rotated files mean new connections
}

// MaxStandInKeys bounds the keys a process remembers having written to stand-ins
// (pool.StandIns): about 100 bytes each plus the key.
const MaxStandInKeys = 100_000

// StandIns is what the topologies' pools remember of stand-in writes; nil before the
// first Build.
func (b *Builder) StandIns() *pool.StandIns {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.standIns
}

// Pending is a topology built but not yet in service: Commit after installing it, or
// Abort to close the servers it created.
type Pending struct {
	Topology   *Topology
	b          *Builder
	servers    map[serverKey]pool.Server
	created    []pool.Server
	migrations map[migrationKey]*migrate.Migration
}

// Build builds the pools, servers and routes that cfg describes.
func (b *Builder) Build(cfg *config.Config) (*Pending, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	pd := &Pending{Topology: &Topology{}, b: b, servers: make(map[serverKey]pool.Server), migrations: make(map[migrationKey]*migrate.Migration)}
	t := pd.Topology
	if b.standIns == nil {
		b.standIns = pool.NewStandIns(MaxStandInKeys, b.logger())
	}
	if b.Features == nil {
		b.Features = route.NewShared(route.Options{Logger: b.logger()})
	}
	byName := make(map[string]*pool.Pool, len(cfg.Pools))
	for _, pc := range cfg.Pools {
		if pc.TLS != nil && pc.TLS.Config == nil && b.Dial {
			// Never fall back to plaintext because a caller forgot the files.
			pd.abortLocked()
			return nil, fmt.Errorf("pool %s: its tls files were not loaded (config.LoadTLS)", pc.Name)
		}
		p, err := pool.New(pc.Name, pool.Options{
			Distribution: pc.Distribution,
			Hash:         pc.Hash,
			HashTag:      pc.HashTag,
			Failover:     pc.Failover,
			FailoverTTL:  pc.FailoverTTL,
			StandIns:     b.standIns,
			Retries:      pc.Retries,
		}, b.members(pd, cfg, pc))
		if err != nil {
			pd.abortLocked()
			return nil, err
		}
		byName[pc.Name] = p
		t.Pools = append(t.Pools, p)
	}
	for _, pc := range cfg.Pools {
		f := route.Features{Backup: byName[pc.Backup], WarmFrom: byName[pc.WarmFrom]}
		if pc.Shadow != nil {
			f.Shadow, f.ShadowFraction = byName[pc.Shadow.Pool], pc.Shadow.Fraction
		}
		b.Features.Compose(byName[pc.Name], f)
	}
	for _, r := range cfg.Routes {
		t.Routes = append(t.Routes, Route{Prefix: []byte(r.Prefix), Pool: byName[r.Pool]})
	}
	def := cfg.DefaultPool
	if def == "" && len(cfg.Pools) == 1 {
		def = cfg.Pools[0].Name
	}
	t.Default = byName[def]
	if t.Default == nil {
		pd.abortLocked()
		return nil, fmt.Errorf("default pool %q does not exist", def)
	}
	t.Dedup, t.NoFlushAll = cfg.Dedup, !cfg.Limits.AllowFlushAll
	if len(cfg.HotCache.Prefixes) > 0 {
		t.Hot = hotcache.New(cfg.HotCache.Prefixes, cfg.HotCache.MaxItems, cfg.HotCache.MaxBytes, cfg.HotCache.TTL)
	}
	for _, prefix := range cfg.FireAndForget.Prefixes {
		t.FireAndForget = append(t.FireAndForget, []byte(prefix))
	}
	for _, l := range cfg.Listeners {
		p := byName[l.DefaultPool]
		if p == nil {
			pd.abortLocked()
			return nil, fmt.Errorf("listener %s: default pool %q does not exist", l.Listen, l.DefaultPool)
		}
		if t.Listeners == nil {
			t.Listeners = map[string]*Topology{}
		}
		t.Listeners[l.Listen] = t.withDefault(p)
	}
	return pd, nil
}

// members makes (or reuses) the servers of one pool.
func (b *Builder) members(pd *Pending, cfg *config.Config, pc *config.Pool) []pool.Member {
	lim := Limits(cfg)
	if pc.Embedded > 0 {
		members := make([]pool.Member, pc.Embedded)
		for i := range members {
			key := serverKey{pool: pc.Name, embeddedIndex: i, embeddedMB: pc.EmbeddedMemoryMB, connections: pc.Embedded}
			members[i] = pool.Member{
				Name:   fmt.Sprintf("shard%d", i),
				Addr:   fmt.Sprintf("embedded/%d", i),
				Weight: 1,
				Server: b.server(pd, key, func() pool.Server {
					return memstore.New(memstore.Options{MaxBytes: int64(pc.EmbeddedMemoryMB) << 20})
				}),
			}
		}
		return members
	}
	if pc.Discover != nil && len(pc.Servers) == 0 {
		// Its name has not answered yet (moxi waits for it before serving; --check does
		// not ask): one member that says so.
		return []pool.Member{{Name: "undiscovered", Addr: "discover:" + pc.Discover.DNS, Weight: 1, Server: undiscovered(pc.Discover.DNS)}}
	}
	var tlsConf *tls.Config
	var tlsSum tlsfiles.Sum
	if pc.TLS != nil {
		tlsConf, tlsSum = pc.TLS.Config, pc.TLS.Sum
	}
	dial := func(ctx context.Context, addr string) (net.Conn, error) {
		return backend.Dial(ctx, addr, pc.ConnectTimeout, tlsConf)
	}
	members := make([]pool.Member, len(pc.Servers))
	for i, sc := range pc.Servers {
		m := &members[i]
		m.Name, m.Addr, m.Weight = sc.RingName(), sc.Addr, sc.Weight
		remote := func(addr string) pool.Server {
			key := serverKey{
				pool: pc.Name, addr: addr, name: m.Name, embeddedIndex: -1,
				connections: pc.Connections, connectTimeout: pc.ConnectTimeout, timeout: pc.Timeout,
				failureLimit: pc.FailureLimit, backoff: pc.DeadBackoff, backoffMax: pc.DeadBackoffMax, limits: lim,
				tls: tlsSum,
			}
			return b.server(pd, key, func() pool.Server {
				if !b.Dial {
					return unconnected{}
				}
				return backend.New(backend.Options{
					Addr:           addr,
					Connections:    pc.Connections,
					ConnectTimeout: pc.ConnectTimeout,
					Timeout:        pc.Timeout,
					FailureLimit:   pc.FailureLimit,
					RetryMin:       pc.DeadBackoff,
					RetryMax:       pc.DeadBackoffMax,
					Limits:         lim,
					TLS:            tlsConf,
					Logger:         b.logger().With("pool", pc.Name, "server", m.Name),
					Observe:        b.observer(pc.Name, m.Name),
				})
			})
		}
		m.Server = remote(sc.Addr)
		if sc.MigrateFrom != "" && b.Dial {
			var old pool.Server // serves the slot until migrate_at: the running one when unchanged
			if !sc.MigrateAt.IsZero() {
				old = remote(sc.MigrateFrom)
			}
			m.Server = b.migration(pd, migrationKey{pc.Name, m.Name, sc.MigrateFrom, sc.Addr, sc.MigrateAt, m.Server}, func() *migrate.Migration {
				return migrate.New(migrate.Options{
					Pool: pc.Name, Name: m.Name, From: sc.MigrateFrom, To: sc.Addr,
					New: m.Server, At: sc.MigrateAt, Old: old, Rate: pc.MigrateRate, Timeout: pc.Timeout + pc.ConnectTimeout,
					MaxValue: lim.MaxValueBytes, Dial: dial, Logger: b.logger(),
				})
			})
		}
	}
	return members
}

// observer is the latency histogram's series for one server, or nil.
func (b *Builder) observer(pool, server string) func(float64) {
	if b.Latency == nil {
		return nil
	}
	return b.Latency.WithLabelValues(pool, server).Observe
}

// migration returns the running migration with key, or a new one (started on Commit).
func (b *Builder) migration(pd *Pending, key migrationKey, create func() *migrate.Migration) *migrate.Migration {
	m, ok := b.migrations[key]
	if !ok {
		m = create()
	}
	pd.migrations[key] = m
	return m
}

// server returns the running server with key, or a new one.
func (b *Builder) server(pd *Pending, key serverKey, create func() pool.Server) pool.Server {
	if s, ok := pd.servers[key]; ok { // listed twice in one config (a config error elsewhere)
		return s
	}
	s, ok := b.running[key]
	if !ok {
		s = create()
		pd.created = append(pd.created, s)
	}
	pd.servers[key] = s
	return s
}

// Commit makes pd the running topology's servers: those of the previous one that pd does
// not use are closed after grace, so that requests that started on the previous topology
// can finish on them. Call it after installing pd.Topology.
func (pd *Pending) Commit(grace time.Duration) {
	b := pd.b
	b.mu.Lock()
	var drop []pool.Server
	for k, s := range b.running {
		if _, kept := pd.servers[k]; !kept {
			drop = append(drop, s)
			if b.Latency != nil && !pd.serves(k.pool, k.name) {
				b.Latency.DeleteLabelValues(k.pool, k.name)
			}
		}
	}
	for k, m := range b.migrations {
		if _, kept := pd.migrations[k]; !kept {
			m.StopCopy() // reverted or finished with: no more copying; closed after the grace
			drop = append(drop, m)
		}
	}
	for k, m := range pd.migrations {
		if _, running := b.migrations[k]; !running {
			m.Start()
		}
	}
	b.running, b.migrations = pd.servers, pd.migrations
	b.mu.Unlock()
	if len(drop) == 0 {
		return
	}
	b.retired.Add(1)
	go func() { // exits after grace; Close waits for it
		defer b.retired.Done()
		time.Sleep(grace) // requests that started on the old topology finish meanwhile
		closeAll(drop)
	}()
}

// serves reports whether pd has a server named name in pool.
func (pd *Pending) serves(pool, name string) bool {
	for k := range pd.servers {
		if k.pool == pool && k.name == name {
			return true
		}
	}
	return false
}

// Abort closes the servers pd created; the running topology is untouched.
func (pd *Pending) Abort() {
	pd.b.mu.Lock()
	defer pd.b.mu.Unlock()
	pd.abortLocked()
}

// abortLocked is Abort with the Builder's mu held.
func (pd *Pending) abortLocked() {
	closeAll(pd.created)
	pd.created = nil
	for k, m := range pd.migrations {
		if _, running := pd.b.migrations[k]; !running {
			_ = m.Close() // never started: closes its connections to OLD
		}
	}
	pd.migrations = nil
}

// Close closes every server, waiting for retired ones, or until ctx ends.
func (b *Builder) Close(ctx context.Context) error {
	b.mu.Lock()
	var all []pool.Server
	for _, m := range b.migrations {
		all = append(all, m)
	}
	for _, s := range b.running {
		all = append(all, s)
	}
	b.running, b.migrations = nil, nil
	b.mu.Unlock()
	closeAll(all)
	done := make(chan struct{})
	go func() { b.retired.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func closeAll(servers []pool.Server) {
	for _, s := range servers {
		_ = s.Close()
	}
}

func (b *Builder) logger() *slog.Logger {
	if b.Logger != nil {
		return b.Logger
	}
	return slog.Default()
}

// undiscovered stands in for the servers of a discover pool whose name has not answered.
type undiscovered string

var _ pool.Server = undiscovered("")

func (u undiscovered) Do(ctx context.Context, order *turn.Turn, _ *protocol.Request, _ []protocol.Response) error {
	order.Dispatched() // failed at once, as every Server's request that cannot be sent
	return fmt.Errorf("no servers: %s has not answered yet", string(u))
}
func (u undiscovered) DoBatch(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error) {
	pool.DoEach(ctx, order, u, reqs, resps, errs)
}
func (undiscovered) Up() bool               { return false }
func (undiscovered) Info() pool.Info        { return pool.Info{State: pool.StateDead} }
func (undiscovered) Stats() []protocol.Stat { return nil }
func (undiscovered) Close() error           { return nil }

// unconnected stands in for a remote server when only the topology's shape is wanted.
type unconnected struct{}

var _ pool.Server = unconnected{}

func (unconnected) Do(ctx context.Context, order *turn.Turn, _ *protocol.Request, _ []protocol.Response) error {
	order.Dispatched() // failed at once, as every Server's request that cannot be sent
	return errors.New("not connected: topology built for --check")
}
func (u unconnected) DoBatch(ctx context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response, errs []error) {
	pool.DoEach(ctx, order, u, reqs, resps, errs)
}
func (unconnected) Up() bool               { return false }
func (unconnected) Info() pool.Info        { return pool.Info{State: pool.StateDead} }
func (unconnected) Stats() []protocol.Stat { return nil }
func (unconnected) Close() error           { return nil }

// Limits are the protocol limits cfg sets.
func Limits(cfg *config.Config) protocol.Limits {
	lim := protocol.DefaultLimits() // MaxLineBytes is not a setting
	lim.MaxKeyBytes = cfg.Limits.MaxKeyBytes
	lim.MaxValueBytes = cfg.Limits.MaxValueBytes
	lim.MaxMultigetKeys = cfg.Limits.MaxMultigetKeys
	return lim
}

// Migrations reports the running topology's migrations.
func (b *Builder) Migrations() []migrate.Status {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]migrate.Status, 0, len(b.migrations))
	for _, m := range b.migrations {
		out = append(out, m.Status())
	}
	slices.SortFunc(out, func(a, b migrate.Status) int { return strings.Compare(a.Pool+"/"+a.Name, b.Pool+"/"+b.Name) })
	return out
}
