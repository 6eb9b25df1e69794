package test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
	"github.com/moxi-proxy/moxi/internal/tlstest"
)

// TestAdminProbesNotLockedOut: with 200 other connections on the admin port, kept alive
// and idle after a scrape or stalled halfway through their headers, fresh /healthz, /readyz
// and /metrics probes are all answered.
func TestAdminProbesNotLockedOut(t *testing.T) {
	const holders, probes = 200, 30
	for _, tc := range []struct {
		name    string
		request string // what each holder sends, then it waits
		whole   bool   // the request is whole: its answer is read, and the connection kept alive
	}{
		{"idle keep-alive", "GET /metrics HTTP/1.1\r\nHost: moxi\r\n\r\n", true},
		{"half-sent headers", "GET /metrics HTTP/1.1\r\nHost: moxi\r\nX-Half: ", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			admin := freeAddr(t)
			p := startMoxi(t, "--admin", admin)
			if err := memcachedtest.WaitListening(admin, 10*time.Second); err != nil {
				t.Fatalf("admin: %v\n%s", err, p.out.String())
			}
			for i := range holders {
				c, err := net.DialTimeout("tcp", admin, 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := io.WriteString(c, tc.request); err != nil {
					t.Fatalf("holder %d: %v", i, err)
				}
				if !tc.whole {
					continue
				}
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatalf("holder %d: %v", i, err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || resp.Close {
					t.Fatalf("holder %d: GET /metrics %d, close %v: want 200 kept alive", i, resp.StatusCode, resp.Close)
				}
			}

			client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
			for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
				answered := 0
				for range probes {
					resp, err := client.Get("http://" + admin + path)
					if err != nil {
						t.Logf("GET %s: %v", path, err)
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode == 200 {
						answered++
					}
				}
				t.Logf("%d %s connections: %s answered %d/%d fresh probes", holders, tc.name, path, answered, probes)
				if answered != probes {
					t.Errorf("%s: %d/%d probes answered", path, answered, probes)
				}
			}
		})
	}
}

// TestStatsSettingsHidden: "stats settings" on the data port names no file (TLS, client
// CA, a pool's TLS files, the admin token) and not the admin address.
func TestStatsSettingsHidden(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	moxiCert, client := ca.Issue(t, dir, "moxi"), ca.Issue(t, dir, "client")
	token := filepath.Join(dir, "admin-token")
	if err := os.WriteFile(token, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	admin := freeAddr(t)
	cfg := fmt.Sprintf(`watch_config: false
tls: {cert: %s, key: %s, client_ca: %s}
admin_token_file: %s
pools:
  main: {embedded: 1}
  remote:
    servers: [%q]
    tls: {ca: %s, cert: %s, key: %s}
default_pool: main
`, moxiCert.CertFile, moxiCert.KeyFile, ca.CertFile, token, memcachedtest.Blackhole(t), ca.CertFile, client.CertFile, client.KeyFile)
	moxi := startMoxi(t, "--config", writeConfig(t, cfg), "--admin", admin)

	c := mustDialTLS(t, moxi.addr, ca.Pool(), client.Certificate(t))
	lines := roundTrip(t, c, c.r, "stats settings\r\n", "END")
	if !containsLine(lines, "STAT pools.remote.connections 4") || lines[len(lines)-1] != "END" {
		t.Fatalf("stats settings: not the running config:\n%s", strings.Join(lines, "\n"))
	}
	for _, l := range lines {
		if strings.Contains(l, dir) || strings.Contains(l, admin) || strings.HasPrefix(l, "STAT admin") {
			t.Errorf("stats settings shows a file or the admin address: %q", l)
		}
	}
}

// TestCacheMemlimitRefused: with allow_flush_all false, cache_memlimit is refused as
// flush_all is and never reaches memcached, whose limit stays; on embedded shards it lowers
// the limit but never raises it past embedded_memory_mb.
func TestCacheMemlimitRefused(t *testing.T) {
	mc := memcachedtest.Start(t) // -m 64
	maxbytes := func() string {
		c, r := dialConn(t, mc.Addr)
		for _, l := range roundTrip(t, c, r, "stats settings\r\n", "END") {
			if v, ok := strings.CutPrefix(l, "STAT maxbytes "); ok {
				return v
			}
		}
		t.Fatal("memcached's stats settings: no maxbytes")
		return ""
	}
	before := maxbytes()
	moxi := startMoxi(t, "--config", writeConfig(t, "limits:\n  allow_flush_all: false\n"+poolConfig("", mc.Addr)))
	c, r := dialConn(t, moxi.addr)
	for _, tc := range []struct{ req, want string }{
		{"cache_memlimit 8\r\n", "CLIENT_ERROR cache_memlimit not allowed"},
		{"flush_all\r\n", "CLIENT_ERROR flush_all not allowed"},
	} {
		if got := roundTrip(t, c, r, tc.req, "OK"); len(got) != 1 || got[0] != tc.want {
			t.Errorf("%q answered %q, want %q", tc.req, got, tc.want)
		}
	}
	if after := maxbytes(); after != before || before != "67108864" {
		t.Errorf("memcached's maxbytes %s before, %s after a refused cache_memlimit 8; want 67108864", before, after)
	}

	embedded := startMoxi(t, "--config", writeConfig(t, "pools:\n  main: {embedded: 2, embedded_memory_mb: 16}\n"))
	c, r = dialConn(t, embedded.addr)
	for _, tc := range []struct {
		limit, want string
	}{
		{"2048", "16777216"}, // raised: held at embedded_memory_mb
		{"8", "8388608"},
		{"16", "16777216"},
		{"17", "16777216"},
	} {
		if got := roundTrip(t, c, r, "cache_memlimit "+tc.limit+"\r\n", "OK"); len(got) != 1 || got[0] != "OK" {
			t.Fatalf("cache_memlimit %s: %q", tc.limit, got)
		}
		shards := 0
		for _, l := range roundTrip(t, c, r, "stats proxy\r\n", "END") {
			if strings.HasSuffix(l, ":limit_maxbytes "+tc.want) {
				shards++
			}
		}
		if shards != 2 {
			t.Errorf("after cache_memlimit %s: %d of 2 shards with limit_maxbytes %s", tc.limit, shards, tc.want)
		}
	}
}
