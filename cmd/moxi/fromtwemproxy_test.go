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
	if len(cfg.Listeners) != 1 || cfg.Listeners[0].Listen != "127.0.0.1:22122" || cfg.Listeners[0].DefaultPool != "beta" {
		t.Errorf("beta is not served on its own port: listeners %+v", cfg.Listeners)
	}
	if alpha.HashTag != "{}" {
		t.Errorf("alpha's hash_tag %q, want {}", alpha.HashTag)
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
	if !strings.Contains(stdout.String(), "preconnect is left out") {
		t.Errorf("output has no comment on preconnect:\n%s", stdout.String())
	}
}

// TestFromTwemproxyRedis: a file that mixes Redis and memcached pools converts (exit 0), the
// Redis pools named in a warning on stderr.
func TestFromTwemproxyRedis(t *testing.T) {
	mixed := writeConfig(t, "r:\n  listen: 127.0.0.1:22120\n  redis: true\n  servers: [\"127.0.0.1:6379:1\"]\n"+
		"m:\n  listen: 127.0.0.1:22121\n  servers: [\"127.0.0.1:11211:1\"]\n")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--from-twemproxy", mixed}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if want := "moxi: warning: " + mixed + ":1: r is a Redis pool, left out"; !strings.HasPrefix(stderr.String(), want) {
		t.Errorf("stderr %q, want %q…", stderr.String(), want)
	}
	if cfg, err := config.Parse(stdout.Bytes(), "converted"); err != nil || len(cfg.Pools) != 1 || cfg.Pools[0].Name != "m" {
		t.Errorf("converted: %v\n%s", err, stdout.String())
	}
}

func TestFromTwemproxyErrors(t *testing.T) {
	redis := writeConfig(t, "r:\n  listen: 127.0.0.1:22121\n  redis: true\n  servers: [\"127.0.0.1:6379:1\"]\n")
	badTag := writeConfig(t, "a:\n  listen: 127.0.0.1:22121\n  hash_tag: \"{\"\n  servers: [\"127.0.0.1:11211:1\"]\n")
	for _, tt := range []struct{ name, path, stderr string }{
		{"missing file", filepath.Join(t.TempDir(), "absent.yml"), "no such file"},
		{"redis pools only", redis, "no memcached pool: every pool is a Redis one (r)"},
		{"bad hash_tag", badTag, "moxi.yaml:3: a.hash_tag: want two characters"},
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
