package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi"
	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/frontend"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/tlsfiles"
	"github.com/moxi-proxy/moxi/internal/tlstest"
	"github.com/moxi-proxy/moxi/internal/turn"
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
	certDir := t.TempDir()
	ca := tlstest.NewCA(t, certDir, "ca")
	cert := ca.Issue(t, certDir, "moxi")
	withTLS := writeConfig(t, "listen: "+filepath.Join(certDir, "moxi.sock")+"\ntls: {cert: "+cert.CertFile+", key: "+cert.KeyFile+"}\n"+
		"pools:\n  main:\n    servers: [127.0.0.1:22212]\n    tls: {ca: "+ca.CertFile+"}\n")
	absentCert := filepath.Join(certDir, "absent.crt")
	badTLS := writeConfig(t, "tls:\n  cert: "+absentCert+"\n  key: "+cert.KeyFile+"\npools: {main: {embedded: 1}}\n")

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
			if want := "moxi " + moxi.Version(version) + "\n"; out != want {
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
		{name: "check socket listen flag", args: []string{"--check", "--listen", "/run/moxi/moxi.sock"}, code: 0, stdout: func(t *testing.T, out string) {
			if cfg := parses(t, out); cfg.Listen != "/run/moxi/moxi.sock" {
				t.Errorf("listen %q, want the socket path", cfg.Listen)
			}
		}},
		{name: "check socket admin flag", args: []string{"--check", "--admin", "/run/moxi/admin.sock"}, code: failure, stderr: []string{"admin.sock"}},
		{name: "check tls", args: []string{"--check", "--config", withTLS}, code: 0, stdout: func(t *testing.T, out string) {
			cfg := parses(t, out)
			if cfg.TLS == nil || cfg.TLS.Cert != cert.CertFile || cfg.Pool("main").TLS == nil || cfg.Pool("main").TLS.CA != ca.CertFile {
				t.Errorf("printed config lost the tls sections:\n%s", out)
			}
		}},
		{name: "check tls file missing", args: []string{"--check", "--config", badTLS}, code: 1, stderr: []string{badTLS + ":2: tls.cert: " + absentCert}},
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
		{name: "help", args: []string{"--help"}, code: 0, stdout: func(t *testing.T, out string) {
			for _, want := range []string{"moxi is a memcached proxy", "Usage: moxi [flags]", "--config file", "--from-twemproxy file", "Examples:\n  moxi "} {
				if !strings.Contains(out, want) {
					t.Errorf("--help has no %q:\n%s", want, out)
				}
			}
		}},
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
				// A usage error is said once, not by the flag package and again by moxi.
				if n := strings.Count(stderr.String(), s); tt.code == 2 && n > 1 {
					t.Errorf("stderr says %q %d times: %q", s, n, stderr.String())
				}
			}
			switch {
			case tt.code == 0 && slices.Contains(tt.args, "--check"):
				// Its one line on stderr: the summary.
				if lines := strings.Split(strings.TrimSpace(stderr.String()), "\n"); len(lines) != 1 || !strings.Contains(lines[0], ": ok: ") {
					t.Errorf("stderr %q on success, want the summary line alone", stderr.String())
				}
			case tt.code == 0 && stderr.Len() > 0:
				t.Errorf("stderr %q on success", stderr.String())
			}
		})
	}
}

// TestSocketFile: listen's Unix socket is made 0660, replaces a stale socket, refuses to
// replace anything else, and is removed when the listener closes.
func TestSocketFile(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "moxi.sock")
	stale, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()

	ln, err := listen(sock, nil, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("listen over a stale socket: %v", err)
	}
	if fi, err := os.Lstat(sock); err != nil || fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != socketMode {
		t.Errorf("socket: %v %v", fi.Mode(), err)
	}
	if _, err := listen(sock, nil, nil, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "another process") {
		t.Errorf("listen on a socket in use: %v", err)
	}
	ln.Close()
	if _, err := os.Lstat(sock); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("socket after Close: %v", err)
	}

	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := listen(file, nil, nil, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("listen on a regular file: %v", err)
	}
	if _, err := os.Lstat(file); err != nil {
		t.Errorf("the regular file: %v", err)
	}
}

// TestTLSHandshakeBounded: a client that connects to the TLS listener and says nothing
// does not hold a write (the frontend's refusal of a client over max_connections) past
// its write deadline.
func TestTLSHandshakeBounded(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	conf, _, err := tlsfiles.Server(ca.Issue(t, dir, "moxi").CertFile, filepath.Join(dir, "moxi.key"), "")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := listen("127.0.0.1:0", nil, func() *tls.Config { return conf }, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	silent, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	nc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	done := make(chan error, 1)
	go func() { _, err := nc.Write([]byte("SERVER_ERROR too many connections\r\n")); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("a write to a client that never handshook succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a write to a client that never handshook blocked past its deadline")
	}
}

// TestCheckReportsEverything: --check on each of ten broken files reports every problem of
// the file in one run, each at its line, the files it names among them.
func TestCheckReportsEverything(t *testing.T) {
	dir := t.TempDir()
	gone := filepath.Join(dir, "gone")
	for _, c := range []struct {
		name, src string
		want      []string // "LINE: FIELD" of each problem, in order
	}{
		{"unknown key, bad duration, bad hash", "pools:\n  main:\n    servers: [\"127.0.0.1:1\"]\n    timout: 1s\n    connect_timeout: soon\n    hash: md6\n",
			[]string{"4: pools.main.timout", "5: pools.main.connect_timeout", "6: pools.main.hash"}},
		{"a missing certificate and a bad value", "tls:\n  cert: " + gone + "/c.pem\n  key: " + gone + "/k.pem\npools:\n  main:\n    servers: [\"127.0.0.1:1\"]\n    retries: many\n",
			[]string{"2: tls.cert", "7: pools.main.retries"}},
		{"a missing token file and a route to no pool", "admin_token_file: " + gone + "/token\npools:\n  main:\n    servers: [\"127.0.0.1:1\"]\nroutes:\n  - {prefix: \"a:\", pool: nowhere}\n",
			[]string{"1: admin_token_file", "6: routes[0].pool"}},
		{"missing secrets and an unknown key", "pools:\n  main:\n    servers: [\"127.0.0.1:1\"]\n    sasl: {user: u, password_file: " + gone + "/pw}\nauth:\n  users_file: " + gone + "/users\nlimits:\n  max_conns: 3\n",
			[]string{"4: pools.main.sasl.password_file", "6: auth.users_file", "8: limits.max_conns"}},
		{"an unclosed list", "pools:\n  main:\n    servers: [\"127.0.0.1:1\"\n    timeout: 1s\n",
			[]string{"3: "}},
		{"a duplicate key and a bad weight", "pools:\n  main:\n    servers:\n      - \"127.0.0.1:1:0\"\n    timeout: 1s\n    timeout: 2s\n",
			[]string{"4: pools.main.servers[0]", "6: pools.main.timeout"}},
		{"readiness of no pool and buckets out of order", "pools:\n  main:\n    servers: [\"127.0.0.1:1\"]\nreadiness:\n  pools: [mian]\nmetrics:\n  latency_buckets: [0.1, 0.01]\n",
			[]string{"5: readiness.pools[0]", "7: metrics.latency_buckets[1]"}},
		{"a backup cycle and a warm-up from itself", "pools:\n  a:\n    servers: [\"127.0.0.1:1\"]\n    backup: b\n  b:\n    servers: [\"127.0.0.1:2\"]\n    backup: a\n    warm_from: b\ndefault_pool: a\n",
			[]string{"4: pools.a.backup", "8: pools.b.warm_from"}}, // the cycle is said once
		{"no default pool and a bad distribution", "pools:\n  a:\n    servers: [\"127.0.0.1:1\"]\n    distribution: rendezvous\n  b:\n    servers: [\"127.0.0.1:2\"]\n",
			[]string{"1: default_pool", "4: pools.a.distribution"}},
		{"a bad listen address and a bad limit", "listen: nowhere\nlimits:\n  max_connections: 0\npools:\n  main:\n    servers: [\"127.0.0.1:1\"]\n",
			[]string{"1: listen", "3: limits.max_connections"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := writeConfig(t, c.src)
			var stdout, stderr bytes.Buffer
			if code := run([]string{"--check", "--config", path}, &stdout, &stderr); code != 1 {
				t.Fatalf("exit %d, want 1\n%s", code, stderr.String())
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			if len(lines) != len(c.want) {
				t.Fatalf("%d problems reported, want %d:\n%s", len(lines), len(c.want), stderr.String())
			}
			for i, w := range c.want {
				if !strings.HasPrefix(lines[i], path+":"+w) {
					t.Errorf("problem %d: %q, want %s:%s…", i+1, lines[i], path, w)
				}
			}
		})
	}
}

// TestTLSParksAfterHandshake: through the TLS listener moxi serves, a connection parks once
// idle, and a client slow to begin its handshake, while the others park, completes it: the
// frontend must see the listener's connection as TLS (it wraps crypto/tls's), or it would
// cut the waiting handshake short to park it.
func TestTLSParksAfterHandshake(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	conf, _, err := tlsfiles.Server(ca.Issue(t, dir, "127.0.0.1").CertFile, filepath.Join(dir, "127.0.0.1.key"), "")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := listen("127.0.0.1:0", nil, func() *tls.Config { return conf }, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	s := &frontend.Server{Handler: storeAll{}}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	defer func() {
		if err := s.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
		<-served
	}()
	clientConf := &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"}
	call := func(nc net.Conn) {
		t.Helper()
		_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.WriteString(nc, "set k 0 0 1\r\nv\r\n"); err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(nc).ReadString('\n'); err != nil || line != "STORED\r\n" {
			t.Fatalf("set: %q %v", line, err)
		}
	}

	slow, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	quick, err := tls.Dial("tcp", ln.Addr().String(), clientConf)
	if err != nil {
		t.Fatal(err)
	}
	defer quick.Close()
	call(quick)
	// The sweeper asks a reader to park after two of its periods waiting: by the time the
	// quick client has parked, it has looked at the slow one's waiting handshake as often.
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(20 * time.Second); s.Parked() != 1; <-tick.C {
		if time.Now().After(deadline) {
			t.Fatalf("the idle TLS connection did not park within 20 s (%d parked)", s.Parked())
		}
	}
	late := tls.Client(slow, clientConf)
	_ = late.SetDeadline(time.Now().Add(20 * time.Second))
	if err := late.Handshake(); err != nil {
		t.Fatalf("a handshake begun after another connection parked: %v", err)
	}
	call(late)
	call(quick) // woken from the poller
}

// storeAll answers every request STORED.
type storeAll struct{}

func (storeAll) Handle(_ context.Context, order *turn.Turn, reqs []protocol.Request, resps []protocol.Response) []protocol.Response {
	if order != nil {
		order.Wait()
		order.Release()
	}
	for range reqs {
		resps = append(resps, protocol.Response{Status: protocol.StatusOK})
	}
	return resps
}
