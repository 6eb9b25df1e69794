// Package discover follows the pools whose servers come from DNS or from a configuration
// endpoint (pools.*.discover): it asks each name or endpoint again every interval and turns
// the answers into the pool's server list, which moxi applies as a reload with that list
// would be.
//
// A/AAAA records give one server per address, at the section's port. SRV records give one
// per target, at the record's port, with the target host name as ring name and the record's
// weight as weight: a StatefulSet pod that comes back with a new address keeps its keys. A
// server missing from the answers is removed only after remove_after, so that a pod that
// blinks out of a Service's answers does not move keys twice. An empty, failed or
// timed-out answer keeps the list: DNS trouble never empties a pool.
//
// A configuration endpoint (ElastiCache, Memorystore) answers "config get cluster" with a
// version and the cluster's nodes (clusterconfig.go, endpoint.go): each node a server named
// by its host name and dialed at its IP address. An answer older than the list in service
// is ignored, and a node the endpoint no longer lists is removed at once: the endpoint's
// list is the cluster.
package discover

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moxi-proxy/moxi/internal/config"
)

// maxWait bounds one lookup: a DNS server that does not answer costs one interval at most.
const maxWait = 5 * time.Second

// Set follows the discover pools of the config moxi started with. Safe for concurrent use.
type Set struct {
	pools  map[string]*pool // by pool name
	errors *prometheus.CounterVec
	logger *slog.Logger
	now    func() time.Time

	changed chan string // a pool whose list changed; buffered, coalesced by the reader
}

// zoneSource names the discovery of zone z of pool: "<pool>/<zone>".
func zoneSource(pool, z string) string { return pool + "/" + z }

// pool is one discover pool's state, or one discovered zone's.
type pool struct {
	name     string // the pool's name, or zoneSource's
	label    string // the pool's name: moxi_discovery_errors_total's label
	opts     config.Discover
	resolver *net.Resolver

	mu       sync.Mutex
	version  int64 // a configuration endpoint's: the version of the list in service
	answered bool
	servers  []config.Server      // in service, ordered by ring name
	missing  map[string]time.Time // ring name -> since when the answers lack it
	failing  string               // the error state last logged; "" when answering
	ready    chan struct{}        // closed at the first answer
}

// Options configure a Set.
type Options struct {
	Registry prometheus.Registerer // moxi_discovery_errors_total goes here; nil = not exported
	Logger   *slog.Logger          // nil = slog.Default()
}

// New returns a Set for cfg's discover pools (none: an empty Set, which is ready at once).
func New(cfg *config.Config, opts Options) *Set {
	s := &Set{
		pools:   map[string]*pool{},
		logger:  cmp.Or(opts.Logger, slog.Default()),
		now:     time.Now,
		changed: make(chan string, 1),
	}
	s.errors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moxi_discovery_errors_total",
		Help: "DNS lookups of a discover pool that failed, timed out or answered nothing: the pool kept its servers.",
	}, []string{"pool"})
	follow := func(name, label string, dc *config.Discover) {
		s.pools[name] = &pool{
			name: name, label: label, opts: *dc, resolver: Resolver(dc.Resolver),
			missing: map[string]time.Time{}, ready: make(chan struct{}),
		}
		s.errors.WithLabelValues(label)
	}
	for _, pc := range cfg.Pools {
		if pc.Discover != nil {
			follow(pc.Name, pc.Name, pc.Discover)
		}
		for _, z := range pc.Zones {
			if dc := pc.ZoneDiscover[z]; dc != nil {
				follow(zoneSource(pc.Name, z), pc.Name, dc)
			}
		}
	}
	if opts.Registry != nil && len(s.pools) > 0 {
		opts.Registry.MustRegister(s.errors)
	}
	return s
}

// Resolver asks addr, or the system's resolver when addr is "".
func Resolver(addr string) *net.Resolver {
	if addr == "" {
		return net.DefaultResolver
	}
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
}

// Pending names the discover pools that have not had a first answer yet.
func (s *Set) Pending() []string {
	var out []string
	for name, p := range s.pools {
		p.mu.Lock()
		if !p.answered {
			out = append(out, name)
		}
		p.mu.Unlock()
	}
	slices.Sort(out)
	return out
}

// Wait waits until every pool has had a first answer, which Run, running meanwhile, asks
// for.
func (s *Set) Wait(ctx context.Context) error {
	for _, p := range s.pools {
		select {
		case <-p.ready:
		case <-ctx.Done():
			return fmt.Errorf("no DNS answer yet for the servers of %s: %w", strings.Join(s.Pending(), ", "), ctx.Err())
		}
	}
	return nil
}

// Run asks every pool's name at once and then at its interval until ctx ends, calling
// changed with the pool's name after each change of its server list that follows the
// first answer (from Run's goroutine, one at a time).
func (s *Set) Run(ctx context.Context, changed func(pool string)) {
	var wg sync.WaitGroup
	for _, p := range s.pools {
		wg.Go(func() { s.follow(ctx, p) })
	}
	go func() { wg.Wait(); close(s.changed) }()
	for name := range s.changed {
		if ctx.Err() == nil {
			changed(name)
		}
	}
}

// follow asks p's name now and then every interval.
func (s *Set) follow(ctx context.Context, p *pool) {
	tick := time.NewTicker(p.opts.Interval)
	defer tick.Stop()
	for {
		if s.poll(ctx, p) {
			select {
			case s.changed <- p.name:
			case <-ctx.Done():
				return
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}

// poll asks p's name once and applies the answer; it reports whether the list changed.
func (s *Set) poll(ctx context.Context, p *pool) bool {
	ctx, cancel := context.WithTimeout(ctx, min(p.opts.Interval, maxWait))
	defer cancel()
	var found []config.Server
	var version int64
	var err error
	if p.opts.ConfigEndpoint != "" {
		var cc ClusterConfig
		if cc, err = AskClusterConfig(ctx, p.opts.ConfigEndpoint); err == nil {
			version = cc.Version
			found, err = clusterServers(cc)
		}
	} else {
		found, err = Lookup(ctx, p.resolver, p.opts)
	}
	if ctx.Err() != nil && errors.Is(ctx.Err(), context.Canceled) {
		return false // shutting down
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil && version < p.version {
		return false // an older answer (another node of the endpoint, behind): the newer stands
	}
	p.version = max(p.version, version)
	if err != nil {
		s.errors.WithLabelValues(p.label).Inc()
		if state := err.Error(); state != p.failing {
			p.failing = state
			s.logger.Warn("discovery gave no servers; the pool keeps its list", "pool", p.name, "source", p.opts.Source(), "err", err, "servers", len(p.servers))
		}
		return false
	}
	if p.failing != "" {
		p.failing = ""
		s.logger.Info("discovery answers again", "pool", p.name, "source", p.opts.Source(), "servers", len(found))
	}
	next := p.merge(found, s.now())
	first := !p.answered
	if first {
		p.answered = true
		close(p.ready)
	}
	if !first && slices.Equal(next, p.servers) {
		return false
	}
	p.servers = next
	return !first
}

// merge is the list that follows an answer: every server found, with the address and
// weight found, and those missing for less than remove_after; ordered by ring name.
func (p *pool) merge(found []config.Server, now time.Time) []config.Server {
	next := slices.Clone(found)
	seen := map[string]bool{}
	for _, s := range found {
		seen[s.RingName()] = true
		delete(p.missing, s.RingName())
	}
	for _, s := range p.servers {
		name := s.RingName()
		if seen[name] {
			continue
		}
		since, ok := p.missing[name]
		if !ok {
			since = now
			p.missing[name] = now
		}
		if now.Sub(since) < p.opts.RemoveAfter {
			next = append(next, s)
			continue
		}
		delete(p.missing, name)
	}
	slices.SortFunc(next, func(a, b config.Server) int { return strings.Compare(a.RingName(), b.RingName()) })
	return next
}

// Servers is pool's list in service, and whether its name has answered yet.
func (s *Set) Servers(pool string) ([]config.Server, bool) {
	p := s.pools[pool]
	if p == nil {
		return nil, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.servers), p.answered
}

// Fill sets the servers of cfg's discover pools to their lists in service. cfg must be
// one no one else uses yet (a config just loaded). A discover pool the Set does not follow
// (added by a reload) is an error: its name is resolved from the next restart on.
func (s *Set) Fill(cfg *config.Config) error {
	for i, pc := range cfg.Pools {
		switch {
		case pc.Discover != nil:
			p := s.pools[pc.Name]
			if p == nil || p.opts != *pc.Discover {
				return fmt.Errorf("pools.%s.discover: a new or changed discover section takes effect at the next restart", pc.Name)
			}
			servers, _ := s.Servers(pc.Name)
			filled := *pc
			filled.Servers = servers
			cfg.Pools[i] = &filled
		case len(pc.ZoneDiscover) > 0:
			// Zone by zone, in listed order: the file's servers, or those discovered.
			var servers []config.Server
			for _, z := range pc.Zones {
				dc := pc.ZoneDiscover[z]
				if dc == nil {
					servers = append(servers, slices.DeleteFunc(slices.Clone(pc.Servers), func(sv config.Server) bool { return sv.Zone != z })...)
					continue
				}
				p := s.pools[zoneSource(pc.Name, z)]
				if p == nil || p.opts != *dc {
					return fmt.Errorf("pools.%s.zones[%s].discover: a new or changed discover section takes effect at the next restart", pc.Name, z)
				}
				found, _ := s.Servers(zoneSource(pc.Name, z))
				for _, sv := range found {
					sv.Zone = z
					servers = append(servers, sv)
				}
			}
			filled := *pc
			filled.Servers = servers
			cfg.Pools[i] = &filled
		}
	}
	return nil
}

// Filled is a copy of cfg, which is in service and so not to be changed, with its discover
// pools' lists in service.
func (s *Set) Filled(cfg *config.Config) (*config.Config, error) {
	c := *cfg
	c.Pools = slices.Clone(cfg.Pools)
	return &c, s.Fill(&c)
}

// Lookup asks r for dc's name once: its A/AAAA records as servers at dc.Port, or its SRV
// records, each target's first address at the record's port, named by the target and
// weighted by the record (all of one weight: 1). An answer with no record is an error.
func Lookup(ctx context.Context, r *net.Resolver, dc config.Discover) ([]config.Server, error) {
	if !dc.SRV {
		addrs, err := r.LookupIPAddr(ctx, dc.DNS)
		if err != nil {
			return nil, err
		}
		var out []config.Server
		for _, a := range addrs {
			out = append(out, config.Server{Addr: net.JoinHostPort(a.IP.String(), strconv.Itoa(dc.Port)), Weight: 1})
		}
		return nonEmpty(dedup(out), dc.DNS)
	}
	_, records, err := r.LookupSRV(ctx, "", "", dc.DNS)
	if err != nil {
		return nil, err
	}
	// Records of one weight are servers of one weight: 1. Kubernetes' DNS gives each of n
	// pods the weight 100/n, which changes with n; a server kept for remove_after would
	// otherwise keep its old weight beside the others' new one, and move keys between the
	// servers that stay.
	equal := !slices.ContainsFunc(records, func(r *net.SRV) bool { return r.Weight != records[0].Weight })
	var out []config.Server
	for _, rec := range records {
		weight := max(int(rec.Weight), 1)
		if equal {
			weight = 1
		}
		target := strings.TrimSuffix(rec.Target, ".")
		addrs, err := r.LookupIPAddr(ctx, target)
		if err != nil {
			return nil, fmt.Errorf("SRV target %s: %w", target, err)
		}
		if len(addrs) == 0 {
			return nil, fmt.Errorf("SRV target %s has no address", target)
		}
		out = append(out, config.Server{
			Name:   target,
			Addr:   net.JoinHostPort(addrs[0].IP.String(), strconv.Itoa(int(rec.Port))),
			Weight: weight,
		})
	}
	return nonEmpty(dedup(out), dc.DNS)
}

// dedup keeps the first server of each ring name: a ring has one point set per name.
func dedup(servers []config.Server) []config.Server {
	seen := map[string]bool{}
	return slices.DeleteFunc(servers, func(s config.Server) bool {
		name := s.RingName()
		if seen[name] {
			return true
		}
		seen[name] = true
		return false
	})
}

func nonEmpty(servers []config.Server, name string) ([]config.Server, error) {
	if len(servers) == 0 {
		return nil, fmt.Errorf("%s: no records", name)
	}
	return servers, nil
}
