package failover

import (
	"encoding/json"
	"testing"

	"github.com/moxi-proxy/moxi/internal/pool"
)

// down is a server that is never up: no cleanup starts.
type down struct{ pool.Server }

func (*down) Up() bool { return false }

// TestExportImport: what one process's StandIns owes, exported by names and imported by
// another over its own servers, is owed there alike: the same keys, to the same stand-ins,
// a replica's away keys and a flush included.
func TestExportImport(t *testing.T) {
	names := []string{"a", "b", "c"}
	old, next := map[string]pool.Server{}, map[string]pool.Server{}
	for _, n := range names {
		old[n], next[n] = &down{}, &down{}
	}
	nameOf := func(servers map[string]pool.Server) func(pool.Server) (string, string, bool) {
		return func(s pool.Server) (string, string, bool) {
			for n, x := range servers {
				if x == s {
					return "main", n, true
				}
			}
			return "", "", false
		}
	}
	l := NewStandIns(100, nil)
	defer l.Close()
	for _, k := range []string{"k1", "k2", "k3"} {
		l.mu.Lock()
		r := l.owe(old["a"], "main", "a").cur
		r.keys[k] = old["b"]
		l.n++
		l.mu.Unlock()
	}
	l.Away(old["c"], "main", "c", []byte("away"))
	l.mu.Lock()
	l.owed[old["c"]].flush = true
	l.mu.Unlock()

	wire, err := json.Marshal(l.Export(nameOf(old)))
	if err != nil {
		t.Fatal(err)
	}
	var owed []Owed
	if err := json.Unmarshal(wire, &owed); err != nil {
		t.Fatal(err)
	}
	m := NewStandIns(100, nil)
	defer m.Close()
	if n := m.Import(owed, func(p, member string) pool.Server { return next[member] }); n != 4 {
		t.Fatalf("imported %d keys, want 4", n)
	}
	if !m.Owes(next["a"]) || !m.Owes(next["c"]) || m.Owes(next["b"]) {
		t.Fatalf("owes a %v, c %v, b %v: want a and c", m.Owes(next["a"]), m.Owes(next["c"]), m.Owes(next["b"]))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.owed[next["a"]]
	for _, k := range []string{"k1", "k2", "k3"} {
		if a.cur.keys[k] != next["b"] {
			t.Errorf("%s owed to %v, want b's server", k, a.cur.keys[k])
		}
	}
	if c := m.owed[next["c"]]; !c.flush || c.cur.keys["away"] != nil {
		t.Errorf("c: flush %v, away key %v", c.flush, c.cur.keys)
	}
	if m.n != 4 {
		t.Errorf("remembered %d keys, want 4", m.n)
	}
}
