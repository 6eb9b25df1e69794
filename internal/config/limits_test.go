package config

import (
	"slices"
	"strings"
	"testing"
)

const limitsSrc = `pools:
  p: {embedded: 1}
auth:
  users_file: /etc/moxi/users
  limits:
    alice: {requests_per_s: 1000}
    "*":
      requests_per_s: 50000
      bytes_per_s: 1048576
    bob:
  namespaces: true
`

// TestAuthLimits: auth.limits is read in file order, an entry without rates names its
// user only, and the YAML moxi writes (GET /config) reads back the same.
func TestAuthLimits(t *testing.T) {
	c := mustParse(t, limitsSrc)
	want := []UserLimit{{User: "alice", RequestsPerS: 1000}, {User: "*", RequestsPerS: 50000, BytesPerS: 1 << 20}, {User: "bob"}}
	if !slices.Equal(c.Auth.Limits, want) {
		t.Fatalf("Limits = %+v, want %+v", c.Auth.Limits, want)
	}
	b, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	back := mustParse(t, string(b))
	if !slices.Equal(back.Auth.Limits, want) {
		t.Errorf("read back from\n%s\nLimits = %+v", b, back.Auth.Limits)
	}
}

func TestAuthLimitsDiff(t *testing.T) {
	for _, tt := range []struct {
		name   string
		change func(a *Auth)
		want   []string
	}{
		{"rate", func(a *Auth) { a.Limits[0].RequestsPerS = 2000 }, []string{"auth.limits.alice.requests_per_s 1000 → 2000"}},
		{"added", func(a *Auth) { a.Limits = append(a.Limits, UserLimit{User: "carol", BytesPerS: 10}) },
			[]string{"auth.limits.carol: added (requests_per_s 0, bytes_per_s 10)"}},
		{"removed", func(a *Auth) { a.Limits = a.Limits[1:] }, []string{"auth.limits.alice: removed"}},
		{"none", func(a *Auth) {}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			prev, next := mustParse(t, limitsSrc), mustParse(t, limitsSrc)
			tt.change(next.Auth)
			if got := Diff(prev, next); !slices.Equal(got, tt.want) {
				t.Errorf("Diff = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestAuthSettings: with namespaces flush_all is refused, and stats settings says so;
// auth.limits, which names every tenant, is not shown to them.
func TestAuthSettings(t *testing.T) {
	for _, tt := range []struct {
		name, src, flush string
	}{
		{"namespaces", limitsSrc, "no"},
		{"no namespaces", "pools:\n  p: {embedded: 1}\nauth: {users_file: /u}\n", "yes"},
		{"no auth", "pools:\n  p: {embedded: 1}\n", "yes"},
		{"flush refused", "pools:\n  p: {embedded: 1}\nlimits: {allow_flush_all: false}\n", "no"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st, err := mustParse(t, tt.src).Settings()
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range st {
				if s.Name == "flush_enabled" && s.Value != tt.flush {
					t.Errorf("flush_enabled %s, want %s", s.Value, tt.flush)
				}
				if strings.HasPrefix(s.Name, "auth.limits") {
					t.Errorf("STAT %s %s shown", s.Name, s.Value)
				}
			}
		})
	}
}
