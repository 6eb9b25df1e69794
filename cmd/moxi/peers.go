package main

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"time"

	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/discover"
	"github.com/moxi-proxy/moxi/internal/peers"
)

// peersRecheck is how often followPeers looks at the config in service when it discovers
// no peers: a reload that names peers takes effect within it.
const peersRecheck = time.Second

// followPeers keeps n's peers those the config in service names (hot_cache.peers), or the
// answers of its peers_discover name, asked every interval, until ctx ends. An answer that
// fails keeps the peers known; this moxi's own admin address is never its own peer.
func followPeers(ctx context.Context, n *peers.Notifier, current func() *config.Config, logger *slog.Logger) {
	for {
		cfg := current()
		hc := cfg.HotCache
		wait := peersRecheck
		switch {
		case hc.PeersDiscover != nil:
			d := *hc.PeersDiscover
			wait = d.Interval
			lctx, cancel := context.WithTimeout(ctx, min(d.Interval, 5*time.Second))
			found, err := discover.Lookup(lctx, discover.Resolver(d.Resolver), d)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					logger.Warn("peers_discover gave no peers; keeping those known", "source", d.Source(), "err", err, "peers", len(n.Peers()))
				}
				break
			}
			var addrs []string
			for _, s := range found {
				if !self(s.Addr, cfg.Admin) {
					addrs = append(addrs, s.Addr)
				}
			}
			n.Set(addrs, hc.PeerToken)
		default:
			n.Set(slices.DeleteFunc(slices.Clone(hc.Peers), func(a string) bool { return self(a, cfg.Admin) }), hc.PeerToken)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// self reports whether addr is this moxi's admin address: the same host:port, or the same
// port on an address of one of this host's interfaces.
func self(addr, admin string) bool {
	if addr == admin {
		return true
	}
	host, port, err := net.SplitHostPort(addr)
	_, adminPort, aerr := net.SplitHostPort(admin)
	if err != nil || aerr != nil || port != adminPort {
		return false
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return false
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}
