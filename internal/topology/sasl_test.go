package topology

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/memcachedtest"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// saslConfig is a config of one pool "main" over addrs whose servers require SASL, as
// alice with the password in passwordFile, its secrets loaded as a reload loads them.
func saslConfig(t *testing.T, passwordFile string, addrs ...string) *config.Config {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "pools:\n  main:\n    failover: false\n    dead_backoff: 10ms\n    dead_backoff_max: 20ms\n    sasl: {user: alice, password_file: %q}\n    servers:\n", passwordFile)
	for i, a := range addrs {
		fmt.Fprintf(&b, "      - {name: s%d, addr: %q}\n", i, a)
	}
	c := parse(t, b.String())
	if err := c.LoadSecrets("t.yaml"); err != nil {
		t.Fatal(err)
	}
	return c
}

// waitState waits until s is in state want.
func waitState(t *testing.T, s pool.Server, want pool.State) pool.Info {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(20 * time.Second); ; <-tick.C {
		if info := s.Info(); info.State == want {
			return info
		}
		if time.Now().After(deadline) {
			t.Fatalf("server %+v, not %s within 20s", s.Info(), want)
		}
	}
}

// TestSASLPasswordChangeReconnects: a pool's sasl password is part of its servers'
// identity: a reload with a new one makes new servers, which connect with it (a wrong one
// leaves them dead, saying why), and a reload that leaves it alone keeps them.
func TestSASLPasswordChangeReconnects(t *testing.T) {
	mc := memcachedtest.StartSASL(t, map[string]string{"alice": "secret"})
	password := filepath.Join(t.TempDir(), "password")
	write := func(p string) {
		if err := os.WriteFile(password, []byte(p+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b := &Builder{Dial: true}
	defer b.Close(context.Background())
	build := func() pool.Server {
		t.Helper()
		pd, err := b.Build(saslConfig(t, password, mc.Addr))
		if err != nil {
			t.Fatal(err)
		}
		pd.Commit(0)
		return pd.Topology.Default.Member(0).Base
	}
	set := func(s pool.Server) error {
		var r [1]protocol.Response
		return pool.Do(context.Background(), s, nil, &protocol.Request{Op: protocol.OpSet, Key: []byte("k"), Value: []byte("v")}, r[:])
	}

	write("secret")
	right := build()
	if err := set(right); err != nil {
		t.Fatalf("set with the right password: %v", err)
	}
	if build() != right {
		t.Error("a reload with the same password made new servers")
	}
	write("wrong")
	wrong := build()
	if wrong == right {
		t.Fatal("a reload with a new password kept the servers authenticated with the old one")
	}
	if info := waitState(t, wrong, pool.StateDead); !strings.Contains(info.Reason, "SASL authentication failed as user alice") {
		t.Errorf("with a wrong password: %+v, want the SASL failure as the reason", info)
	}
	write("secret")
	again := build()
	if err := set(again); err != nil {
		t.Fatalf("set with the right password again: %v", err)
	}
}

// TestSASLReshardIsCold: keys move between servers by text commands, which servers that
// require SASL do not speak, so a change of such a pool's servers moves nothing.
func TestSASLReshardIsCold(t *testing.T) {
	users := map[string]string{"alice": "secret"}
	mcs := []*memcachedtest.Server{memcachedtest.StartSASL(t, users), memcachedtest.StartSASL(t, users), memcachedtest.StartSASL(t, users)}
	password := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(password, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	b := &Builder{Dial: true}
	defer b.Close(context.Background())
	first, err := b.Build(saslConfig(t, password, mcs[0].Addr, mcs[1].Addr))
	if err != nil {
		t.Fatal(err)
	}
	first.Commit(0)
	for _, servers := range [][]string{{mcs[0].Addr, mcs[1].Addr, mcs[2].Addr}, {mcs[1].Addr, mcs[2].Addr}} {
		pd, err := b.Build(saslConfig(t, password, servers...))
		if err != nil {
			t.Fatal(err)
		}
		if run := pd.placements["main"].reshard; run != nil || len(pd.migrations) != 0 {
			t.Errorf("servers %v: reshard %+v with %d migrations, want none", servers, run, len(pd.migrations))
		}
		for _, m := range pd.Topology.Members() {
			if _, ok := m.Server.(*reshardServer); ok {
				t.Errorf("servers %v: %s reads keys through from their old servers", servers, m.Addr)
			}
		}
		pd.Commit(0)
	}
	if ms := b.Migrations(); len(ms) != 0 {
		t.Errorf("/migrations: %+v, want none", ms)
	}
}
