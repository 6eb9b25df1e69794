package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/moxi-proxy/moxi/internal/config"
)

// writeConfig writes body to a file in a fresh temporary directory and returns its path.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "moxi.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

const validConfig = `listen: 127.0.0.1:22211
admin: ""
pools:
  main:
    distribution: ketama
    hash: fnv1a_64
    servers:
      - 127.0.0.1:22212
      - 127.0.0.1:22213:2
      - 127.0.0.1:22214:1 cache-c
  sessions:
    embedded: 2
default_pool: main
routes:
  - prefix: "sess:"
    pool: sessions
`

// unknownKeyConfig has a misspelt key on line 5.
const unknownKeyConfig = `listen: 127.0.0.1:22211
pools:
  main:
    embedded: 1
    conections: 4
`

// failure, as a wanted exit code, accepts any non-zero one.
const failure = -1

func TestRun(t *testing.T) {
	valid := writeConfig(t, validConfig)
	unknown := writeConfig(t, unknownKeyConfig)
	missing := filepath.Join(t.TempDir(), "absent.yaml")

	// parses checks that --check printed a config that config.Parse accepts, and returns it.
	parses := func(t *testing.T, stdout string) *config.Config {
		t.Helper()
		cfg, err := config.Parse([]byte(stdout), "stdout")
		if err != nil {
			t.Fatalf("printed config does not parse: %v\n%s", err, stdout)
		}
		return cfg
	}
	tests := []struct {
		name   string
		args   []string
		code   int // or failure: any non-zero exit
		stdout func(t *testing.T, out string)
		stderr []string // substrings stderr must contain
	}{
		{name: "version", args: []string{"--version"}, code: 0, stdout: func(t *testing.T, out string) {
			if want := "moxi " + version + "\n"; out != want {
				t.Errorf("stdout %q, want %q", out, want)
			}
		}},
		{name: "check default", args: []string{"--check"}, code: 0, stdout: func(t *testing.T, out string) {
			cfg := parses(t, out)
			want, err := config.Default().YAML()
			if err != nil {
				t.Fatal(err)
			}
			if out != string(want) {
				t.Errorf("printed\n%s\nwant the default\n%s", out, want)
			}
			if len(cfg.Pools) != 1 || cfg.Pools[0].Embedded != 2 || cfg.Listen != "127.0.0.1:11211" {
				t.Errorf("default is not 2 embedded shards on 127.0.0.1:11211:\n%s", out)
			}
		}},
		{name: "check valid file", args: []string{"--check", "--config", valid}, code: 0, stdout: func(t *testing.T, out string) {
			cfg := parses(t, out)
			main := cfg.Pool("main")
			if main == nil || len(main.Servers) != 3 || main.Hash != "fnv1a_64" || cfg.Pool("sessions") == nil {
				t.Errorf("printed config lost the file's pools:\n%s", out)
			}
			if len(cfg.Routes) != 1 || cfg.Routes[0].Prefix != "sess:" || cfg.Listen != "127.0.0.1:22211" {
				t.Errorf("printed config lost the file's routes or listen:\n%s", out)
			}
			if main != nil && main.Timeout == 0 {
				t.Errorf("printed config has no defaults filled in:\n%s", out)
			}
		}},
		{name: "check with address flags", args: []string{"--check", "--config", valid, "--listen", "127.0.0.1:3333", "--admin", "127.0.0.1:4444"}, code: 0,
			stdout: func(t *testing.T, out string) {
				if cfg := parses(t, out); cfg.Listen != "127.0.0.1:3333" || cfg.Admin != "127.0.0.1:4444" {
					t.Errorf("listen %q admin %q, want the flags' addresses", cfg.Listen, cfg.Admin)
				}
			}},
		{name: "check admin off", args: []string{"--check", "--admin", ""}, code: 0, stdout: func(t *testing.T, out string) {
			if cfg := parses(t, out); cfg.Admin != "" {
				t.Errorf("admin %q, want off", cfg.Admin)
			}
		}},
		{name: "unknown key", args: []string{"--check", "--config", unknown}, code: 1, stderr: []string{unknown + ":5:", "conections"}},
		{name: "unknown key without check", args: []string{"--config", unknown}, code: 1, stderr: []string{unknown + ":5:", "conections"}},
		// The printed config must be one that --config accepts, so a flag's bad address is
		// an error like the same address in the file (exit 1, or 2 as a usage error).
		{name: "check bad listen flag", args: []string{"--check", "--listen", "garbage"}, code: failure, stderr: []string{"garbage"}},
		{name: "check bad admin flag", args: []string{"--check", "--admin", "127.0.0.1:99999"}, code: failure, stderr: []string{"99999"}},
		{name: "missing file", args: []string{"--check", "--config", missing}, code: 1, stderr: []string{missing}},
		{name: "bad log level", args: []string{"--log-level", "loud"}, code: 2, stderr: []string{"--log-level"}},
		{name: "bad log format", args: []string{"--log-format", "xml"}, code: 2, stderr: []string{"--log-format"}},
		{name: "unknown flag", args: []string{"--frobnicate"}, code: 2, stderr: []string{"frobnicate"}},
		{name: "stray argument", args: []string{"--check", "extra"}, code: 2, stderr: []string{"extra"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tt.args, &stdout, &stderr)
			if code != tt.code && (tt.code != failure || code == 0) {
				want := strconv.Itoa(tt.code)
				if tt.code == failure {
					want = "non-zero"
				}
				t.Fatalf("exit %d, want %s\nstdout: %s\nstderr: %s", code, want, stdout.String(), stderr.String())
			}
			if tt.stdout != nil {
				tt.stdout(t, stdout.String())
			} else if stdout.Len() > 0 {
				t.Errorf("stdout %q, want nothing", stdout.String())
			}
			for _, s := range tt.stderr {
				if !strings.Contains(stderr.String(), s) {
					t.Errorf("stderr %q does not contain %q", stderr.String(), s)
				}
			}
			if tt.code == 0 && stderr.Len() > 0 {
				t.Errorf("stderr %q on success", stderr.String())
			}
		})
	}
}
