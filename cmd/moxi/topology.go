package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"moxi/internal/backend"
	"moxi/internal/config"
	"moxi/internal/hotcache"
	"moxi/internal/ketama"
	"moxi/internal/memstore"
	"moxi/internal/pool"
	"moxi/internal/protocol"
	"moxi/internal/proxy"
)

// topology is a proxy.Topology together with the servers to close when it is retired.
type topology struct {
	*proxy.Topology
	closers []func() error
}

func (t *topology) close() {
	for _, c := range t.closers {
		_ = c()
	}
}

// buildTopology builds the pools, servers and routes that cfg describes. With dial false
// remote servers are placeholders that never connect (for --check).
func buildTopology(cfg *config.Config, logger *slog.Logger, dial bool) (*topology, error) {
	t := &topology{Topology: &proxy.Topology{}}
	byName := make(map[string]*pool.Pool, len(cfg.Pools))
	for _, pc := range cfg.Pools {
		members := t.buildMembers(cfg, pc, logger, dial)
		p, err := pool.New(pc.Name, pool.Options{
			Distribution: pc.Distribution,
			Hash:         pc.Hash,
			Failover:     pc.Failover,
			Retries:      pc.Retries,
		}, members)
		if err != nil {
			t.close()
			return nil, err
		}
		byName[pc.Name] = p
		t.Pools = append(t.Pools, p)
	}
	for _, pc := range cfg.Pools {
		if pc.Backup != "" {
			if t.Backups == nil {
				t.Backups = make(map[*pool.Pool]*pool.Pool)
			}
			t.Backups[byName[pc.Name]] = byName[pc.Backup]
		}
	}
	for _, r := range cfg.Routes {
		t.Routes = append(t.Routes, proxy.Route{Prefix: []byte(r.Prefix), Pool: byName[r.Pool]})
	}
	def := cfg.DefaultPool
	if def == "" && len(cfg.Pools) == 1 {
		def = cfg.Pools[0].Name
	}
	t.Dedup = cfg.Dedup
	if len(cfg.HotCache.Prefixes) > 0 {
		t.Hot = hotcache.New(cfg.HotCache.Prefixes, cfg.HotCache.MaxItems, cfg.HotCache.TTL)
	}
	for _, prefix := range cfg.FireAndForget.Prefixes {
		t.FireAndForget = append(t.FireAndForget, []byte(prefix))
	}
	t.Default = byName[def]
	if t.Default == nil {
		t.close()
		return nil, fmt.Errorf("default pool %q does not exist", def)
	}
	return t, nil
}

func (t *topology) buildMembers(cfg *config.Config, pc *config.Pool, logger *slog.Logger, dial bool) []pool.Member {
	if pc.Embedded > 0 {
		members := make([]pool.Member, pc.Embedded)
		for i := range members {
			members[i] = pool.Member{
				Name:   fmt.Sprintf("shard%d", i),
				Addr:   fmt.Sprintf("embedded/%d", i),
				Weight: 1,
				Server: memstore.New(memstore.Options{MaxBytes: int64(pc.EmbeddedMemoryMB) << 20}),
			}
		}
		return members
	}
	members := make([]pool.Member, len(pc.Servers))
	for i, sc := range pc.Servers {
		m := &members[i]
		m.Name, m.Addr, m.Weight = memberName(sc), sc.Addr, sc.Weight
		if !dial {
			m.Server = unconnected{}
			continue
		}
		b := backend.New(backend.Options{
			Addr:           sc.Addr,
			Connections:    pc.Connections,
			ConnectTimeout: pc.ConnectTimeout,
			Timeout:        pc.Timeout,
			FailureLimit:   pc.FailureLimit,
			RetryMin:       pc.DeadBackoff,
			RetryMax:       pc.DeadBackoffMax,
			Limits:         protocolLimits(cfg),
			Logger:         logger.With("pool", pc.Name, "server", m.Name),
		})
		m.Server = b
		t.closers = append(t.closers, b.Close)
	}
	return members
}

// unconnected stands in for a remote server when only the topology's shape is wanted.
type unconnected struct{}

func (unconnected) Do(context.Context, *protocol.Request, []protocol.Response) error {
	return errors.New("not connected: topology built for --check")
}

// memberName is a server's ring identity: its configured name, else its address in
// libmemcached's form.
func memberName(s config.Server) string {
	if s.Name != "" {
		return s.Name
	}
	return ketama.ServerName(s.Addr)
}

func protocolLimits(cfg *config.Config) protocol.Limits {
	lim := protocol.DefaultLimits
	lim.MaxKeyBytes = cfg.Limits.MaxKeyBytes
	lim.MaxValueBytes = cfg.Limits.MaxValueBytes
	lim.MaxMultigetKeys = cfg.Limits.MaxMultigetKeys
	return lim
}
