package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moxi-proxy/moxi/internal/admin"
	"github.com/moxi-proxy/moxi/internal/backend"
	"github.com/moxi-proxy/moxi/internal/discover"
	"github.com/moxi-proxy/moxi/internal/failover"
	"github.com/moxi-proxy/moxi/internal/frontend"
	"github.com/moxi-proxy/moxi/internal/handover"
	"github.com/moxi-proxy/moxi/internal/hotkeys"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/proxy"
	"github.com/moxi-proxy/moxi/internal/sdnotify"
	"github.com/moxi-proxy/moxi/internal/topology"
)

// Upgrading in place (docs/operating.md, "Upgrade in place"): SIGUSR2 or POST /upgrade
// starts the binary at moxi's own path with the same arguments and hands it, over an
// inherited Unix socket (package handover), the listening sockets, what moxi remembers and
// then its client connections, each at a request boundary; the old process exits once it
// has handed everything over. The successor takes the sockets instead of listening.

// readyWithin bounds the successor's start: config loaded, listeners taken, state received.
const readyWithin = 10 * time.Second

// The state sections, each JSON: a successor ignores a section it does not know (a
// downgrade), and starts without one its predecessor did not send.
const (
	stateStandIns = "standins" // the keys stand-ins and away replicas owe (failover.Owed)
	stateDead     = "dead"     // the servers out of service, with their probes' backoff (deadServer)
	stateDiscover = "discover" // the discovered server lists, with servers pending removal (discover.PoolState)
	stateMoving   = "moving"   // the reshards and rebuilds under way (topology.MovingState)
	stateHotKeys  = "hotkeys"  // each pool's hot-key counts (hotkeys.SketchState by pool)
)

// deadServer is a server out of service, as the state names it.
type deadServer struct {
	Pool   string `json:"pool"`
	Server string `json:"server"`
	backend.DeadState
}

// deadMarker is a server whose death can be handed over (a memcached server, not an
// embedded one).
type deadMarker interface {
	Dead() (backend.DeadState, bool)
	MarkDead(backend.DeadState)
}

var _ deadMarker = (*backend.Server)(nil)

// sockets are listening sockets moxi did not open itself, by the address configured for
// them: its predecessor's (an upgrade) or systemd's (socket activation).
type sockets struct {
	data  map[string]net.Listener
	admin net.Listener
}

// take is the socket for addr, if one was passed, which only one caller gets.
func (s *sockets) take(addr string) net.Listener {
	if s == nil {
		return nil
	}
	ln := s.data[addr]
	delete(s.data, addr)
	return ln
}

// takeAdmin is the admin socket, if one was passed.
func (s *sockets) takeAdmin() net.Listener {
	if s == nil {
		return nil
	}
	ln := s.admin
	s.admin = nil
	return ln
}

// successor is what a moxi started by an upgrade got from its predecessor.
type successor struct {
	ch      *handover.Channel
	sockets *sockets
	state   map[string]json.RawMessage
}

// fromPredecessor takes over from the moxi that started this one, when one did (the
// handover socket in the environment): greetings, listening sockets and state. nil when
// this moxi was started otherwise.
func fromPredecessor(logger *slog.Logger) (*successor, error) {
	ch, ok, err := handover.FromEnv()
	if err != nil || !ok {
		return nil, err
	}
	fail := func(err error) (*successor, error) {
		_ = ch.Send(handover.Fail{Reason: err.Error()}, nil)
		ch.Close()
		return nil, fmt.Errorf("taking over from the previous moxi: %w", err)
	}
	_ = ch.SetDeadline(time.Now().Add(readyWithin))
	hello, _, err := handover.Await[handover.Hello](ch)
	if err != nil {
		return fail(err)
	}
	if err := ch.Send(handover.Hello{Version: handover.Version, PID: os.Getpid()}, nil); err != nil {
		return fail(err)
	}
	lns, files, err := handover.Await[handover.Listeners](ch)
	if err != nil {
		return fail(err)
	}
	s := &sockets{data: map[string]net.Listener{}}
	for i, l := range lns.Listeners {
		ln, err := net.FileListener(files[i])
		files[i].Close()
		if err != nil {
			return fail(fmt.Errorf("listener %s: %w", l.Addr, err))
		}
		if l.Kind == handover.KindAdmin {
			s.admin = ln
		} else {
			s.data[l.Addr] = ln
		}
	}
	state, _, err := handover.Await[handover.State](ch)
	if err != nil {
		return fail(err)
	}
	logger.Info("upgrade: taking over", "from_pid", hello.PID, "listeners", len(lns.Listeners))
	return &successor{ch: ch, sockets: s, state: state.Sections}, nil
}

// section decodes the state section name into v; false when the predecessor sent none.
func (s *successor) section(name string, v any) (bool, error) {
	if s == nil || s.state[name] == nil {
		return false, nil
	}
	if err := json.Unmarshal(s.state[name], v); err != nil {
		return false, fmt.Errorf("state %s: %w", name, err)
	}
	return true, nil
}

// importDiscovery seeds disc, before its first lookup, with the predecessor's server lists
// and the time each missing server has been missing: no server moves at the upgrade.
func (s *successor) importDiscovery(disc *discover.Set) error {
	var pools []discover.PoolState
	ok, err := s.section(stateDiscover, &pools)
	if ok {
		disc.Import(pools)
	}
	return err
}

// resume has b, before its first Build, go on with the reshards and rebuilds its
// predecessor was running.
func (s *successor) resume(b *topology.Builder) error {
	var moving topology.MovingState
	ok, err := s.section(stateMoving, &moving)
	if ok {
		b.Resume(moving)
	}
	return err
}

// importState applies the rest of the predecessor's memory to the first topology: the
// servers it had out of service, with their probes' backoff (so that their keys stay with
// their stand-ins until they answer again), the keys stand-ins owe, and the hot keys.
func (s *successor) importState(b *topology.Builder, t *topology.Topology, logger *slog.Logger) error {
	var dead []deadServer
	if _, err := s.section(stateDead, &dead); err != nil {
		return err
	}
	for _, d := range dead {
		if m, ok := memberServer(t, d.Pool, d.Server).(deadMarker); ok {
			st := d.DeadState
			st.Reason = "dead before the upgrade: " + st.Reason
			m.MarkDead(st)
		}
	}
	var owed []failover.Owed
	if ok, err := s.section(stateStandIns, &owed); err != nil {
		return err
	} else if ok {
		n := b.StandIns().Import(owed, func(p, member string) pool.Server { return memberServer(t, p, member) })
		logger.Info("upgrade: stand-in writes remembered", "keys", n)
	}
	var hot map[string]hotkeys.SketchState
	if ok, err := s.section(stateHotKeys, &hot); err != nil {
		return err
	} else if ok {
		t.ImportHotKeys(hot)
	}
	return nil
}

// ready tells the predecessor this moxi serves, then adopts the client connections it
// hands over (handlerFor gives each listener's handler), until it is done. Under systemd
// this process becomes the service's main process.
func (s *successor) ready(front *frontend.Server, handlerFor func(addr string) frontend.Handler, logger *slog.Logger) error {
	defer s.ch.Close()
	if err := s.ch.Send(handover.Ready{}, nil); err != nil {
		return err
	}
	_ = s.ch.SetDeadline(time.Time{}) // the connections come as they reach a request boundary
	adopted := 0
	err := handover.RecvConns(s.ch, func(recs []handover.ConnRecord, files []*os.File) error {
		for i, r := range recs {
			err := front.Adopt(handlerFor(r.Listener), frontend.Handed{File: files[i], Listener: r.Listener, Binary: r.Binary,
				Sniffed: r.Sniffed, User: r.User, PerKey: r.KeyEstimate, FailedLogins: r.FailedLogins, Affinity: r.Affinity})
			if err != nil {
				logger.Warn("upgrade: a client connection could not be adopted", "err", err)
				continue
			}
			adopted++
		}
		return nil
	})
	logger.Info("upgrade: client connections taken over", "connections", adopted)
	if err := sdnotify.Notify(sdnotify.MainPID(os.Getpid()) + "\n" + sdnotify.Ready); err != nil {
		logger.Warn("systemd notification failed", "err", err)
	}
	return err
}

// memberServer is the server of member of the pool named poolName in t, or nil.
func memberServer(t *topology.Topology, poolName, member string) pool.Server {
	for _, pl := range t.Pools {
		if pl.Name() != poolName {
			continue
		}
		for i := range pl.Len() {
			if m := pl.Member(i); m.Name == member {
				return m.Base
			}
		}
	}
	return nil
}

// upgrader upgrades this moxi in place.
type upgrader struct {
	exe            string   // the executable's path, found at start: it holds the new binary by now
	args           []string // moxi's arguments
	logger         *slog.Logger
	front          *frontend.Server
	px             *proxy.Proxy
	builder        *topology.Builder
	disc           *discover.Set
	shutdown       func() time.Duration // the config's shutdown_timeout
	requestTimeout func() time.Duration // and limits.request_timeout

	data     []addressed // the data listeners, main first
	admin    net.Listener
	upgrades *prometheus.CounterVec

	running   atomic.Bool
	closing   atomic.Bool   // the listeners are closed here on purpose: Serve's return is no failure
	handedAll chan struct{} // closed once everything is handed over: the process exits
	once      sync.Once
}

// addressed is a listening socket and the address configured for it.
type addressed struct {
	addr string
	ln   net.Listener
}

// newUpgrader returns the upgrader of a moxi started with args.
func newUpgrader(args []string, logger *slog.Logger, reg prometheus.Registerer) *upgrader {
	exe, err := os.Executable()
	if err != nil {
		logger.Warn("upgrade in place unavailable: the executable's path is unknown", "err", err)
	}
	u := &upgrader{exe: exe, args: args, logger: logger, handedAll: make(chan struct{}),
		upgrades: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "moxi_upgrades_total",
			Help: "Upgrades in place (SIGUSR2, POST /upgrade) this process started, by result: ok (the successor took over), failed (it exited or was not ready within 10s: this process kept serving).",
		}, []string{"result"})}
	u.upgrades.WithLabelValues("ok")
	u.upgrades.WithLabelValues("failed")
	reg.MustRegister(u.upgrades)
	return u
}

var _ admin.Upgrader = (*upgrader)(nil)

// Upgrade starts the successor and hands it the listening sockets and the state; once it
// is ready it hands over the client connections in the background and returns. It
// fails, leaving this process serving as before, when the successor exits or is not
// ready within readyWithin; admin.ErrUpgrading while an upgrade runs.
func (u *upgrader) Upgrade() error {
	if !u.running.CompareAndSwap(false, true) {
		return admin.ErrUpgrading
	}
	u.logger.Info("upgrade: starting the successor", "path", u.exe)
	cmd, ch, files, err := u.start()
	if err != nil {
		u.running.Store(false)
		u.upgrades.WithLabelValues("failed").Inc()
		u.logger.Error("upgrade failed: this process keeps serving", "err", err)
		return err
	}
	u.upgrades.WithLabelValues("ok").Inc()
	go u.handOver(cmd, ch, files)
	return nil
}

// start is the first half of Upgrade: the successor started, its sockets and state sent,
// and its Ready received. files are the listening sockets sent, kept until the end.
func (u *upgrader) start() (*exec.Cmd, *handover.Channel, []*os.File, error) {
	if u.exe == "" {
		return nil, nil, nil, errors.New("the executable's path is unknown")
	}
	ch, child, err := handover.Pair()
	if err != nil {
		return nil, nil, nil, err
	}
	cmd := exec.Command(u.exe, u.args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.Env = append(sdnotify.StripListenEnv(os.Environ()), handover.EnvFD+"=3") // ExtraFiles[0] is descriptor 3
	cmd.ExtraFiles = []*os.File{child}
	if err := cmd.Start(); err != nil {
		child.Close()
		ch.Close()
		return nil, nil, nil, err
	}
	child.Close()
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	var files []*os.File
	fail := func(err error) (*exec.Cmd, *handover.Channel, []*os.File, error) {
		_ = cmd.Process.Kill()
		<-exited
		ch.Close()
		for _, f := range files {
			f.Close()
		}
		return nil, nil, nil, err
	}
	// A successor that exits ends the exchange at once: its end of the socket closes.
	_ = ch.SetDeadline(time.Now().Add(readyWithin))
	if err := ch.Send(handover.Hello{Version: handover.Version, PID: os.Getpid()}, nil); err != nil {
		return fail(err)
	}
	if _, _, err := handover.Await[handover.Hello](ch); err != nil {
		return fail(fmt.Errorf("the successor's hello: %w", err))
	}
	var lns []handover.Listener
	for i, a := range u.data {
		f, err := fileOf(a.ln)
		if err != nil {
			return fail(err)
		}
		kind := handover.KindListener
		if i == 0 {
			kind = handover.KindListen
		}
		lns = append(lns, handover.Listener{Addr: a.addr, Kind: kind})
		files = append(files, f)
	}
	if u.admin != nil {
		f, err := fileOf(u.admin)
		if err != nil {
			return fail(err)
		}
		lns = append(lns, handover.Listener{Addr: u.admin.Addr().String(), Kind: handover.KindAdmin})
		files = append(files, f)
	}
	if err := ch.Send(handover.Listeners{Listeners: lns}, files); err != nil {
		return fail(err)
	}
	state, err := u.state()
	if err != nil {
		return fail(err)
	}
	if err := ch.Send(handover.State{Sections: state}, nil); err != nil {
		return fail(err)
	}
	if _, _, err := handover.Await[handover.Ready](ch); err != nil {
		return fail(fmt.Errorf("the successor was not ready: %w", err))
	}
	u.logger.Info("upgrade: the successor is ready", "pid", cmd.Process.Pid)
	return cmd, ch, files, nil
}

// state is what this moxi remembers, by section, for its successor.
func (u *upgrader) state() (map[string]json.RawMessage, error) {
	t := u.px.Topology()
	var dead []deadServer
	for _, pl := range t.Pools {
		for i := range pl.Len() {
			m := pl.Member(i)
			if d, ok := m.Base.(deadMarker); ok {
				if st, isDead := d.Dead(); isDead {
					dead = append(dead, deadServer{Pool: pl.Name(), Server: m.Name, DeadState: st})
				}
			}
		}
	}
	sections := map[string]any{
		stateStandIns: u.builder.StandIns().Export(func(s pool.Server) (string, string, bool) { return memberName(t, s) }),
		stateDead:     dead,
		stateDiscover: u.disc.Export(),
		stateMoving:   u.builder.Moving(),
		stateHotKeys:  t.ExportHotKeys(),
	}
	out := make(map[string]json.RawMessage, len(sections))
	for name, v := range sections {
		raw, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("state %s: %w", name, err)
		}
		out[name] = raw
	}
	return out, nil
}

// handOver is the second half of Upgrade: this process stops accepting (the successor
// accepts on the same sockets), and hands every plain client connection over at its next
// request boundary, once its fire-and-forget writes have landed. Then it signals the
// process to end (handedAll): TLS connections stay to the end of shutdown_timeout.
func (u *upgrader) handOver(cmd *exec.Cmd, ch *handover.Channel, files []*os.File) {
	defer ch.Close()
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	u.closing.Store(true)
	for _, a := range u.data {
		if ul, ok := rawListener(a.ln).(*net.UnixListener); ok {
			ul.SetUnlinkOnClose(false) // the successor serves on the same path
		}
		a.ln.Close()
	}
	if u.admin != nil {
		u.admin.Close()
	}
	_ = ch.SetDeadline(time.Time{})
	// A request under way is finished here first: its connection moves at the boundary
	// after it. request_timeout bounds how long a client may take to send one.
	ctx, cancel := context.WithTimeout(context.Background(), max(u.shutdown(), u.requestTimeout()))
	defer cancel()
	listenerOf := func(h frontend.Handler) string {
		if l, ok := h.(proxy.Listener); ok {
			return l.Addr()
		}
		return u.data[0].addr
	}
	handed := 0
	plain, tls, err := u.front.HandOver(ctx, listenerOf, func(batch []frontend.Handed) error {
		if err := u.px.Settled(ctx); err != nil {
			return err
		}
		recs := make([]handover.ConnRecord, len(batch))
		fs := make([]*os.File, len(batch))
		for i, h := range batch {
			recs[i] = handover.ConnRecord{Listener: h.Listener, Binary: h.Binary, Sniffed: h.Sniffed, User: h.User,
				KeyEstimate: h.PerKey, FailedLogins: h.FailedLogins, Affinity: h.Affinity}
			fs[i] = h.File
		}
		_, err := handover.SendConns(ch, recs, fs, handover.MaxFDs)
		handed += len(batch)
		return err
	})
	if err != nil {
		u.logger.Error("upgrade: handing client connections over stopped; the rest are served here until they close or shutdown_timeout passes",
			"err", err, "handed", handed, "left", plain)
	}
	_ = ch.Send(handover.Done{}, nil)
	u.logger.Info("upgrade: handed over; this process ends once its TLS connections close (shutdown_timeout at most)",
		"connections", handed, "tls_connections_left", tls, "successor_pid", cmd.Process.Pid)
	if err := sdnotify.Notify(sdnotify.MainPID(cmd.Process.Pid)); err != nil {
		u.logger.Warn("systemd notification failed", "err", err)
	}
	u.once.Do(func() { close(u.handedAll) })
}

// fileOf is a duplicate of the socket under ln, to send.
func fileOf(ln net.Listener) (*os.File, error) {
	switch l := rawListener(ln).(type) {
	case *net.TCPListener:
		return l.File()
	case *net.UnixListener:
		return l.File()
	}
	return nil, fmt.Errorf("listener %s: not a socket that can be handed over", ln.Addr())
}

// rawListener is the socket listener under ln (a TLS listener wraps one).
func rawListener(ln net.Listener) net.Listener {
	if t, ok := ln.(*tlsListener); ok {
		return t.Listener
	}
	return ln
}

// memberName names s, a member's server of t, by its pool and member name.
func memberName(t *topology.Topology, s pool.Server) (string, string, bool) {
	for _, pl := range t.Pools {
		for i := range pl.Len() {
			if m := pl.Member(i); m.Base == s {
				return pl.Name(), m.Name, true
			}
		}
	}
	return "", "", false
}
