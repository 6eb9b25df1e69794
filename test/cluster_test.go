package test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// cluster is n real memcached servers.
func cluster(t testing.TB, n int) []*memcachedtest.Server {
	t.Helper()
	out := make([]*memcachedtest.Server, n)
	for i := range out {
		out[i] = memcachedtest.Start(t)
	}
	return out
}

// writeConfig writes a moxi config file and returns its path.
func writeConfig(t testing.TB, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "moxi.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// poolConfig is a config with one pool "main" over addrs (already in moxi's server form).
func poolConfig(extra string, servers ...string) string {
	var b strings.Builder
	b.WriteString("pools:\n  main:\n    timeout: 2s\n")
	b.WriteString(extra)
	b.WriteString("    servers:\n")
	for _, s := range servers {
		fmt.Fprintf(&b, "      - %q\n", s)
	}
	return b.String()
}

func addrs(servers []*memcachedtest.Server) []string {
	out := make([]string, len(servers))
	for i, s := range servers {
		out[i] = s.Addr
	}
	return out
}
