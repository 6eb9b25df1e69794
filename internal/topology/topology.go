// Package topology builds the proxy's routing table from a config, reusing the running
// servers that the new config leaves unchanged, so that a reload keeps their connections,
// their health and (for embedded shards) their data.
package topology

import (
	"cmp"
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
	"github.com/moxi-proxy/moxi/internal/failover"
	"github.com/moxi-proxy/moxi/internal/hotcache"
	"github.com/moxi-proxy/moxi/internal/hotkeys"
	"github.com/moxi-proxy/moxi/internal/memstore"
	"github.com/moxi-proxy/moxi/internal/migrate"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/replica"
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
	// Latency, when set, gets each remote server's answer times, labelled pool and server —
	// or pool alone when LatencyByPool is set (metrics.per_server: false).
	Latency       *prometheus.HistogramVec
	LatencyByPool bool
	// Features is what the servers composed with a pool's backup, warm_from and shadow
	// pools share (package route); nil = one of the Builder's own, made by the first Build.
	Features *route.Shared

	mu         sync.Mutex
	standIns   *failover.StandIns                  // shared by every pool built; made by the first Build
	running    map[serverKey]pool.Server           // the servers of the committed topology
	migrations map[migrationKey]*migrate.Migration // its migrations
	placements map[string]placing                  // its pools' key placements, by pool name (reshard.go)
	reshards   map[string]int                      // per pool, the number of its last reshard
	rebuilds   []rebuildRun                        // running and lately ended (rebuild.go)
	resumed    *MovingState                        // what Resume was handed, until the first Commit (resume.go)
	// rebuildCount is, per pool, the number of its last rebuild.
	rebuildCount map[string]int
	// hotKeys are the committed topology's sketches by pool name, counted with hotKeysConfig.
	hotKeys       map[string]*hotkeys.Sketch
	hotKeysConfig hotkeys.Config
	retired       sync.WaitGroup // servers closing after their grace
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
	sasl                backend.SASL // the credentials: a new user or password means new connections
}

// MaxStandInKeys bounds the keys a process remembers having written to stand-ins
// (failover.StandIns): about 100 bytes each plus the key.
const MaxStandInKeys = 100_000

// StandIns is what the topologies' pools remember of stand-in writes; nil before the
// first Build.
func (b *Builder) StandIns() *failover.StandIns {
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
	placements map[string]placing
	// hotKeys: as Builder's, for this topology (hotKeysOf).
	hotKeys       map[string]*hotkeys.Sketch
	hotKeysConfig hotkeys.Config
}

// Build builds the pools, servers and routes that cfg describes.
func (b *Builder) Build(cfg *config.Config) (*Pending, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	pd := &Pending{Topology: &Topology{}, b: b, servers: make(map[serverKey]pool.Server), migrations: make(map[migrationKey]*migrate.Migration),
		placements: make(map[string]placing)}
	t := pd.Topology
	if b.standIns == nil {
		b.standIns = failover.NewStandIns(MaxStandInKeys, b.logger())
		b.standIns.Flushed = b.flushed
	}
	if b.Features == nil {
		b.Features = route.NewShared(route.Options{Logger: b.logger()})
	}
	byName := make(map[string]*pool.Pool, len(cfg.Pools))
	servers := make(map[string]memberServers, len(cfg.Pools))
	for _, pc := range cfg.Pools {
		if pc.TLS != nil && pc.TLS.Config == nil && b.Dial {
			// Never fall back to plaintext because a caller forgot the files.
			pd.abortLocked()
			return nil, fmt.Errorf("pool %s: its tls files were not loaded (config.LoadTLS)", pc.Name)
		}
		if pc.SASL != nil && pc.SASL.Password == nil && b.Dial {
			pd.abortLocked()
			return nil, fmt.Errorf("pool %s: its sasl password_file was not loaded (config.LoadSecrets)", pc.Name)
		}
		ms := b.members(pd, cfg, pc)
		p, err := pool.New(pc.Name, pool.Options{
			Distribution: pc.Distribution,
			Hash:         pc.Hash,
			HashTag:      pc.HashTag,
			Failover:     pc.Failover,
			Retries:      pc.Retries,
			Replicas:     pc.Replicas,
			Zones:        pc.Zones,
			Debts:        b.standIns,
		}, ms.members)
		if err != nil {
			pd.abortLocked()
			return nil, err
		}
		byName[pc.Name] = p
		t.Pools = append(t.Pools, p)
		servers[pc.Name] = ms
	}
	for _, pc := range cfg.Pools {
		ms := servers[pc.Name]
		st := Stack{
			Migration:   b.migrating(pd, cfg, pc, ms),
			Reshard:     b.reshard(pd, cfg, pc, ms),
			StandIns:    b.standIns,
			FailoverTTL: pc.FailoverTTL,
			Replica: replica.Options{
				WriteQuorum: pc.WriteQuorum,
				ReadFrom:    pc.ReadFrom,
				LocalZone:   slices.Index(pc.Zones, cfg.Zone),
				Writes:      &b.Features.Writes,
				Background:  b.Features.Background(),
				Repaired:    b.Features.ReplicaRepaired(pc.Name),
				ZoneRead:    b.Features.ZoneRead(pc.Name),
			},
			Features: route.Features{Backup: byName[pc.Backup], WarmFrom: byName[pc.WarmFrom]},
		}
		if pc.Shadow != nil {
			st.Shadow, st.ShadowFraction = byName[pc.Shadow.Pool], pc.Shadow.Fraction
		}
		if t.placed == nil {
			t.placed = make(map[*pool.Pool][]pool.Server, len(cfg.Pools))
		}
		t.placed[byName[pc.Name]] = Compose(byName[pc.Name], b.Features, st)
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
	t.Namespaced = cfg.Auth != nil && cfg.Auth.Namespaces
	if len(cfg.HotCache.Prefixes) > 0 || cfg.HotKeys.Enabled && cfg.HotKeys.Cache {
		t.Hot = hotcache.New(cfg.HotCache.Prefixes, cfg.HotCache.MaxItems, cfg.HotCache.MaxBytes, cfg.HotCache.TTL, &b.Features.Writes)
		t.Hot.Namespaced = t.Namespaced
	}
	b.hotKeysOf(pd, cfg)
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

// memberServers are the servers of one pool's members (layer 1 of their Stack).
type memberServers struct {
	members []pool.Member
	// remotes[i] makes member i's server at an address (nil for an embedded or undiscovered
	// pool): a Migration's OLD for migrate_at or apply_at.
	remotes []func(addr string) pool.Server
	dial    migrate.Dialer // how a Migration reaches the pool's servers
}

// members makes (or reuses) the servers of one pool.
func (b *Builder) members(pd *Pending, cfg *config.Config, pc *config.Pool) memberServers {
	lim := Limits(cfg)
	if pc.Embedded > 0 {
		members := make([]pool.Member, pc.Embedded)
		for i := range members {
			key := serverKey{pool: pc.Name, embeddedIndex: i, embeddedMB: pc.EmbeddedMemoryMB, connections: pc.Embedded}
			members[i] = pool.Member{
				Name:   fmt.Sprintf("shard%d", i),
				Addr:   pool.EmbeddedAddr(i),
				Weight: 1,
				Server: b.server(pd, key, func() pool.Server {
					return memstore.New(memstore.Options{MaxBytes: int64(pc.EmbeddedMemoryMB) << 20})
				}),
			}
		}
		return memberServers{members: members}
	}
	if pc.Discover != nil && len(pc.Servers) == 0 {
		// Its name has not answered yet (moxi waits for it before serving; --check does
		// not ask): one member that says so.
		what := cmp.Or(pc.Discover.DNS, pc.Discover.ConfigEndpoint)
		return memberServers{members: []pool.Member{{Name: "undiscovered", Addr: "discover:" + what, Weight: 1, Server: undiscovered(what)}}}
	}
	var tlsConf *tls.Config
	var tlsSum tlsfiles.Sum
	if pc.TLS != nil {
		tlsConf, tlsSum = pc.TLS.Config, pc.TLS.Sum
	}
	var sasl backend.SASL
	if pc.SASL != nil {
		sasl = backend.SASL{User: pc.SASL.User, Password: string(pc.SASL.Password)}
	}
	ms := memberServers{
		members: make([]pool.Member, len(pc.Servers)),
		dial: func(ctx context.Context, addr string) (net.Conn, error) {
			return backend.Dial(ctx, addr, pc.ConnectTimeout, tlsConf)
		},
	}
	for i, sc := range pc.Servers {
		m := &ms.members[i]
		m.Name, m.Addr, m.Weight, m.Zone = sc.MemberName(), sc.Addr, sc.Weight, sc.Zone
		remote := func(addr string) pool.Server {
			key := serverKey{
				pool: pc.Name, addr: addr, name: m.Name, embeddedIndex: -1,
				connections: pc.Connections, connectTimeout: pc.ConnectTimeout, timeout: pc.Timeout,
				failureLimit: pc.FailureLimit, backoff: pc.DeadBackoff, backoffMax: pc.DeadBackoffMax, limits: lim,
				tls: tlsSum, sasl: sasl,
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
					SASL:           sasl,
					Pool:           pc.Name,
					Logger:         b.logger().With("pool", pc.Name, "server", m.Name),
					Observe:        b.observer(pc.Name, m.Name),
					Restarted:      func(at int64) { b.restarted(pc.Name, key.name, addr, at) },
				})
			})
		}
		m.Server = remote(sc.Addr)
		ms.remotes = append(ms.remotes, remote)
	}
	// A discovered zone whose source has not answered yet (moxi waits for it before
	// serving; --check does not ask): one member that says so.
	for _, z := range pc.Zones {
		dc := pc.ZoneDiscover[z]
		if dc == nil || slices.ContainsFunc(pc.Servers, func(sc config.Server) bool { return sc.Zone == z }) {
			continue
		}
		what := cmp.Or(dc.DNS, dc.ConfigEndpoint)
		ms.members = append(ms.members, pool.Member{Name: z + "/undiscovered", Addr: "discover:" + what, Weight: 1, Zone: z, Server: undiscovered(what)})
	}
	return ms
}

// migrating is layer 2 of pc's Stack: a member with migrate_from becomes a Migration from
// that server to its own (next). nil when no member has one.
func (b *Builder) migrating(pd *Pending, cfg *config.Config, pc *config.Pool, ms memberServers) func(int, pool.Server) pool.Server {
	if !b.Dial || !slices.ContainsFunc(pc.Servers, func(sc config.Server) bool { return sc.MigrateFrom != "" }) {
		return nil
	}
	lim := Limits(cfg)
	return func(i int, next pool.Server) pool.Server {
		sc, m := pc.Servers[i], &ms.members[i]
		if sc.MigrateFrom == "" {
			return next
		}
		var old pool.Server // serves the slot until migrate_at: the running one when unchanged
		if !sc.MigrateAt.IsZero() {
			old = ms.remotes[i](sc.MigrateFrom)
		}
		return b.migration(pd, migrationKey{pc.Name, m.Name, sc.MigrateFrom, sc.Addr, sc.MigrateAt, next}, func() *migrate.Migration {
			return migrate.New(migrate.Options{
				Pool: pc.Name, Name: m.Name, From: sc.MigrateFrom, To: sc.Addr,
				New: next, At: sc.MigrateAt, Old: old, Rate: pc.MigrateRate, Timeout: pc.Timeout + pc.ConnectTimeout,
				MaxValue: lim.MaxValueBytes, Dial: ms.dial, Logger: b.logger(),
			})
		})
	}
}

// reshard records pc's placement in pd and returns layer 3 of its Stack: while keys move
// into it from the committed one (a change of pc's servers, now or at an earlier build not
// yet done), each member that keys move to becomes a reshardServer with a Migration from
// each server they move from. nil when no key moves. A pool whose servers require SASL
// reshards cold: nothing moves.
func (b *Builder) reshard(pd *Pending, cfg *config.Config, pc *config.Pool, ms memberServers) func(int, pool.Server) pool.Server {
	if len(pc.Servers) == 0 || len(ms.remotes) != len(ms.members) {
		return nil // embedded, or a discover pool with no answer yet: nothing to move
	}
	now := placing{placement: placementOf(pc), copy: copySettings{
		rate: pc.MigrateRate, timeout: pc.Timeout + pc.ConnectTimeout, maxValue: Limits(cfg).MaxValueBytes, dial: ms.dial, sasl: pc.SASL != nil,
	}}
	after, err := now.placement.newPool(pc.Name)
	if err != nil {
		return nil // pool.New refuses the same members, with the same error, in Build
	}
	now.pool = after
	cur, had := b.placements[pc.Name]
	switch {
	case !had:
	case cur.placement.equal(now.placement):
		// The same servers: keys still moving go on moving, until every copy is done.
		if cur.reshard != nil && !b.reshardDone(pc.Name, cur.reshard.name) {
			now.reshard = cur.reshard
		}
	default:
		now.reshard = &reshardRun{name: runName(reshardKind, b.reshards[pc.Name]+1), before: cur.pool, from: cur.placement}
	}
	if now.reshard != nil && pc.SASL != nil {
		// Keys move by lru_crawler metadump and meta commands, text that servers requiring
		// SASL do not speak: the keys stay where they are, and miss until written again.
		if b.Dial {
			b.logger().Warn("reshard is cold: the pool's servers require SASL, which allows only the binary protocol, and moving keys to their new servers takes the text one",
				"pool", pc.Name)
		}
		now.reshard = nil
	}
	pd.placements[pc.Name] = now
	if now.reshard == nil || !b.Dial {
		return nil
	}
	run := now.reshard
	moves := after.MovedFrom(run.before)
	return func(i int, next pool.Server) pool.Server {
		// A reshardServer is made anew at each build; next, the member's server, is what
		// stand-ins remember (Member.Base), which outlives reloads.
		self := ms.members[i].Addr
		var rs *reshardServer
		for _, mv := range moves {
			if mv.To != self {
				continue
			}
			if rs == nil {
				rs = &reshardServer{self: self, next: next, before: run.before, after: after, from: map[string]*migrate.Migration{}}
			}
			var old pool.Server // serves the key until apply_at
			if !cfg.ApplyAt.IsZero() {
				old = ms.remotes[i](mv.From)
			}
			rs.from[mv.From] = b.migration(pd, migrationKey{pc.Name, run.name, mv.From, mv.To, cfg.ApplyAt, next}, func() *migrate.Migration {
				return migrate.New(migrate.Options{
					Pool: pc.Name, Name: run.name, From: mv.From, To: mv.To,
					New: next, At: cfg.ApplyAt, Old: old, Rate: now.copy.rate, Timeout: now.copy.timeout,
					MaxValue: now.copy.maxValue, Dial: ms.dial, Logger: b.logger(),
					Moves: func(key []byte) bool {
						from, ok := after.PairedFrom(run.before, key, self)
						return ok && from == mv.From
					},
					DeleteMoved: true,
				})
			})
		}
		if rs == nil {
			return next
		}
		return rs
	}
}

// reshardDone reports whether every Migration of pool's reshard name is done.
func (b *Builder) reshardDone(pool, name string) bool {
	for k, m := range b.migrations {
		if k.pool == pool && k.name == name && m.Phase() != migrate.Done {
			return false
		}
	}
	return true
}

// observer is the latency histogram's series for one server, or nil.
func (b *Builder) observer(pool, server string) func(float64) {
	switch {
	case b.Latency == nil:
		return nil
	case b.LatencyByPool:
		return b.Latency.WithLabelValues(pool).Observe
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
			switch {
			case b.Latency == nil:
			case !b.LatencyByPool && !pd.serves(k.pool, k.name):
				b.Latency.DeleteLabelValues(k.pool, k.name)
			case b.LatencyByPool && !pd.servesPool(k.pool):
				b.Latency.DeleteLabelValues(k.pool)
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
			m.Copy()
		}
	}
	b.running, b.migrations, b.placements = pd.servers, pd.migrations, pd.placements
	b.hotKeys, b.hotKeysConfig = pd.hotKeys, pd.hotKeysConfig
	b.stopRebuildsLocked(pd.serves)
	if b.reshards == nil {
		b.reshards = map[string]int{}
	}
	for name, pl := range pd.placements {
		if pl.reshard != nil {
			b.reshards[name] = max(b.reshards[name], runNumber(reshardKind, pl.reshard.name))
		}
	}
	b.resumeLocked()
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

// servesPool reports whether pd keeps a server of pool.
func (pd *Pending) servesPool(pool string) bool {
	for k := range pd.servers {
		if k.pool == pool {
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
	b.stopRebuildsLocked(nil)
	b.running, b.migrations = nil, nil
	standIns := b.standIns
	b.mu.Unlock()
	closeAll(all)
	if standIns != nil {
		standIns.Close() // after the servers: its cleanups' requests then fail at once
	}
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

func (u undiscovered) Start(_ context.Context, order *turn.Turn, _ []protocol.Request, _ []protocol.Response, errs []error, done func()) {
	pool.Fail(order, errs, fmt.Errorf("no servers: %s has not answered yet", string(u)), done)
}
func (undiscovered) Up() bool               { return false }
func (undiscovered) Info() pool.Info        { return pool.Info{State: pool.StateDead} }
func (undiscovered) Stats() []protocol.Stat { return nil }
func (undiscovered) Close() error           { return nil }

// unconnected stands in for a remote server when only the topology's shape is wanted.
type unconnected struct{}

var _ pool.Server = unconnected{}

func (unconnected) Start(_ context.Context, order *turn.Turn, _ []protocol.Request, _ []protocol.Response, errs []error, done func()) {
	pool.Fail(order, errs, errNotConnected, done)
}

var errNotConnected = errors.New("not connected: topology built for --check")

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
	reshards := map[[3]string][]migrate.Status{} // by pool, name and zone
	for k, m := range b.migrations {
		if runNumber(reshardKind, k.name) > 0 {
			st := m.Status()
			// A pool with zones reshards zone by zone: an entry per zone, named after it.
			zone := ""
			if pl, ok := b.placements[k.pool]; ok {
				for i := range pl.pool.Len() {
					if mb := pl.pool.Member(i); mb.Addr == k.to && mb.Zone != "" {
						zone = mb.Zone
						st.Name = zone + "/" + st.Name
					}
				}
			}
			key := [3]string{k.pool, k.name, zone}
			reshards[key] = append(reshards[key], st)
			continue
		}
		out = append(out, m.Status())
	}
	for _, parts := range reshards {
		out = append(out, mergeStatus(parts))
	}
	for _, r := range b.rebuilds {
		out = append(out, r.Status())
	}
	slices.SortFunc(out, func(a, b migrate.Status) int { return strings.Compare(a.Pool+"/"+a.Name, b.Pool+"/"+b.Name) })
	return out
}

// mergeStatus is a reshard's progress: that of its Migrations together, under its name.
// From and To list the servers keys move from and to; the phase is failed when one
// failed, else scheduled or copying while one is, else done.
func mergeStatus(parts []migrate.Status) migrate.Status {
	out := migrate.Status{Pool: parts[0].Pool, Name: parts[0].Name, Phase: migrate.Done}
	var from, to []string
	rank := map[string]int{migrate.Done: 0, migrate.Scheduled: 1, migrate.Copying: 2, migrate.Failed: 3}
	for _, st := range parts {
		out.KeysCopied += st.KeysCopied
		out.KeysTotal += st.KeysTotal
		if rank[st.Phase] > rank[out.Phase] {
			out.Phase = st.Phase
		}
		if out.Started.IsZero() || !st.Started.IsZero() && st.Started.Before(out.Started) {
			out.Started = st.Started
		}
		if st.Finished.After(out.Finished) {
			out.Finished = st.Finished
		}
		if out.Err == "" {
			out.Err = st.Err
		}
		from, to = append(from, st.From), append(to, st.To)
	}
	if out.Phase != migrate.Done && out.Phase != migrate.Failed {
		out.Finished = time.Time{}
	}
	slices.Sort(from)
	slices.Sort(to)
	out.From, out.To = strings.Join(slices.Compact(from), ","), strings.Join(slices.Compact(to), ",")
	return out
}
