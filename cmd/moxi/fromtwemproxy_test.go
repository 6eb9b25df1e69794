package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moxi-proxy/moxi/internal/config"
)

// TestFromTwemproxy: --from-twemproxy prints a config that --check accepts, with every
// pool, server and ring name of the nutcracker.yml.
func TestFromTwemproxy(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--from-twemproxy", "testdata/nutcracker.yml"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	converted := writeConfig(t, stdout.String())
	var checked, checkErr bytes.Buffer
	if code := run([]string{"--check", "--config", converted}, &checked, &checkErr); code != 0 {
		t.Fatalf("--check rejects the converted config (exit %d): %s\n%s", code, checkErr.String(), stdout.String())
	}
	cfg, err := config.Parse(checked.Bytes(), "checked")
	if err != nil {
		t.Fatal(err)
	}
	alpha, beta := cfg.Pool("alpha"), cfg.Pool("beta")
	if alpha == nil || beta == nil || cfg.Listen != "127.0.0.1:22121" || cfg.DefaultPool != "alpha" {
		t.Fatalf("converted config lost pools or listen:\n%s", checked.String())
	}
	var names []string
	for _, p := range []*config.Pool{alpha, beta} {
		for _, s := range p.Servers {
			names = append(names, s.RingName())
		}
	}
	if got, want := strings.Join(names, ","), "127.0.0.1,127.0.0.1:11212,cache-c,b1,b2"; got != want {
		t.Errorf("ring names %s, want %s", got, want)
	}
	if alpha.Hash != "fnv1a_64" || alpha.Distribution != "ketama" || beta.Hash != "md5" || beta.Distribution != "modula" {
		t.Errorf("placement settings changed:\n%s", checked.String())
	}
	for _, note := range []string{"hash_tag", "run one moxi per listen address"} {
		if !strings.Contains(stdout.String(), note) {
			t.Errorf("output has no comment on %q:\n%s", note, stdout.String())
		}
	}
}

func TestFromTwemproxyErrors(t *testing.T) {
	redis := writeConfig(t, "r:\n  listen: 127.0.0.1:22121\n  redis: true\n  servers: [\"127.0.0.1:6379:1\"]\n")
	for _, tt := range []struct{ name, path, stderr string }{
		{"missing file", filepath.Join(t.TempDir(), "absent.yml"), "no such file"},
		{"redis pool", redis, "moxi.yaml:3: r.redis: moxi speaks memcached only"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run([]string{"--from-twemproxy", tt.path}, &stdout, &stderr); code != 1 {
				t.Errorf("exit %d, want 1", code)
			}
			if !strings.Contains(stderr.String(), tt.stderr) || stdout.Len() > 0 {
				t.Errorf("stdout %q, stderr %q: want %q on stderr only", stdout.String(), stderr.String(), tt.stderr)
			}
		})
	}
}
