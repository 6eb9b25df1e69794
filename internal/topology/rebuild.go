package topology

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/moxi-proxy/moxi/internal/migrate"
	"github.com/moxi-proxy/moxi/internal/pool"
)

// A rebuild refills a server of a replicated pool that came back empty — its memcached
// restarted (backend.Options.Restarted), or moxi flushed it before it served again
// (failover.StandIns.Flushed) — from the pool's other servers: a migrate.Rebuild, listed in
// /migrations as rebuild-<n>, n counting up per pool.

// copySettings are how a pool's keys are copied between its servers (reshards, rebuilds).
type copySettings struct {
	rate     int
	timeout  time.Duration // per request: the pool's timeout plus its connect timeout
	maxValue int
	dial     migrate.Dialer
	sasl     bool // binary only: no metadump, no copy
}

// maxRebuildsListed bounds the rebuilds a pool keeps in /migrations: the running ones and
// the last ones ended.
const maxRebuildsListed = 8

// rebuildSerial numbers the flushes this process rebuilds after, for their lock keys.
var rebuildSerial atomic.Int64

// rebuildRun is a rebuild the Builder started, and the lock it names, for a successor
// (Builder.Moving).
type rebuildRun struct {
	*migrate.Rebuild
	lock string
}

// restarted starts the rebuild of pool's server name at addr, whose memcached restarted at
// startedAt (unix seconds): every proxy of a tier names the same lock for it.
func (b *Builder) restarted(poolName, name, addr string, startedAt int64) {
	b.rebuild(RebuildState{Pool: poolName, Server: name, Addr: addr, Lock: "__moxi__:rebuild:" + strconv.FormatInt(startedAt, 10)})
}

// flushed starts the rebuild of a replica this process flushed: no other proxy of the tier
// flushed it at that instant, so the lock is this process's own.
func (b *Builder) flushed(poolName, name string) {
	host, _ := os.Hostname()
	b.rebuild(RebuildState{Pool: poolName, Server: name, Lock: fmt.Sprintf("__moxi__:rebuild:flush:%s:%d:%d", host, os.Getpid(), rebuildSerial.Add(1))})
}

// rebuild starts rs (see rebuildLocked).
func (b *Builder) rebuild(rs RebuildState) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rebuildLocked(rs)
}

// rebuildLocked starts a rebuild of rs.Pool's member rs.Server (at rs.Addr, when given) if
// the running topology keeps several copies of its keys. It is named rs.Name, or when that
// is no rebuild-<n>, after the pool's next number.
func (b *Builder) rebuildLocked(rs RebuildState) {
	pl, ok := b.placements[rs.Pool]
	if !ok || pl.pool.Replicas() < 2 {
		return // one copy of each key: nothing to refill it from
	}
	self := -1
	var from []string
	for i := range pl.pool.Len() {
		m := pl.pool.Member(i)
		if m.Name == rs.Server && (rs.Addr == "" || m.Addr == rs.Addr) {
			self = i
		} else {
			from = append(from, m.Addr)
		}
	}
	target := b.runningServer(rs.Pool, rs.Server)
	if self < 0 || target == nil {
		return // no longer in the running topology
	}
	if pl.copy.sasl {
		b.logger().Warn("no rebuild: the pool's servers require SASL, which allows only the binary protocol, and listing their keys takes the text one; reads repair the keys they find missing",
			"pool", rs.Pool, "server", rs.Server)
		return
	}
	if b.rebuildCount == nil {
		b.rebuildCount = map[string]int{}
	}
	n := runNumber(rebuildKind, rs.Name)
	if n == 0 {
		n = b.rebuildCount[rs.Pool] + 1
	}
	b.rebuildCount[rs.Pool] = max(b.rebuildCount[rs.Pool], n)
	placed := pl.pool
	r := migrate.NewRebuild(migrate.RebuildOptions{
		Pool: rs.Pool, Name: runName(rebuildKind, n), Server: rs.Server, To: placed.Member(self).Addr,
		Target: target, From: from,
		Holds: func(key []byte) bool { set := placed.ReplicaSetOf(key); return set.Has(self) },
		Lock:  rs.Lock, Predecessor: rs.Holder, Rate: pl.copy.rate, Timeout: pl.copy.timeout, MaxValue: pl.copy.maxValue, Dial: pl.copy.dial,
		Writes: &b.Features.Writes, Logger: b.logger(),
	})
	b.rebuilds = append(b.rebuilds, rebuildRun{r, rs.Lock})
	b.pruneRebuildsLocked(rs.Pool)
	r.Start()
}

// runningServer is the running topology's server of pool's member name (layer 1), or nil.
func (b *Builder) runningServer(poolName, name string) pool.Server {
	for k, s := range b.running {
		if k.pool == poolName && k.name == name {
			return s
		}
	}
	return nil
}

// pruneRebuildsLocked drops the oldest ended rebuilds of pool past maxRebuildsListed.
func (b *Builder) pruneRebuildsLocked(poolName string) {
	n := 0
	for i := len(b.rebuilds) - 1; i >= 0; i-- {
		r := b.rebuilds[i]
		if r.Status().Pool != poolName {
			continue
		}
		if n++; n > maxRebuildsListed && r.Done() {
			b.rebuilds = slices.Delete(b.rebuilds, i, i+1)
		}
	}
}

// stopRebuildsLocked stops the rebuilds whose server the running topology no longer has
// (keep nil: every one), and drops them.
func (b *Builder) stopRebuildsLocked(keep func(poolName, name string) bool) {
	b.rebuilds = slices.DeleteFunc(b.rebuilds, func(r rebuildRun) bool {
		st := r.Status()
		if keep != nil && keep(st.Pool, st.Server) {
			return false
		}
		r.Stop()
		return true
	})
}
