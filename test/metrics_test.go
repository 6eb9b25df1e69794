package test

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// operatorMetrics is every metric family an operator's dashboards and alerts rely on (docs/operating.md). moxi_warmup_reads_total
// and moxi_shadow_requests_total have series for the pools with warm_from or shadow only:
// the config below has one (how they move: warmup_test.go, shadow_test.go).
var operatorMetrics = []string{
	"moxi_requests_total", "moxi_request_duration_seconds", "moxi_backend_requests_total",
	"moxi_backend_errors_total", "moxi_backend_up", "moxi_connections_current",
	"moxi_dedup_coalesced_total", "moxi_hotcache_hits_total", "moxi_hotcache_misses_total",
	"moxi_fire_and_forget_pending", "moxi_config_reloads_total", "moxi_migration_keys_copied",
	"moxi_migration_keys_listed", "moxi_migration_phase", "moxi_build_info",
	"moxi_config_last_reload_successful", "moxi_config_last_reload_success_timestamp_seconds",
	"moxi_get_hits_total", "moxi_get_misses_total", "moxi_error_answers_total",
	"moxi_connections_total", "moxi_warmup_reads_total", "moxi_shadow_requests_total", "moxi_config_info",
}

// versionLine is what moxi answers to "version" for the version moxi_build_info names:
// "2.0.0" answers "VERSION 2.0.0 moxi", "2.0.0+dev" (a build that is not the release)
// "VERSION 2.0.0 moxi/dev".
func versionLine(v string) string {
	release, build, ok := strings.Cut(v, "+")
	if !ok {
		return "VERSION " + release + " moxi"
	}
	return "VERSION " + release + " moxi/" + build
}

// adminDo sends an admin request, with "Authorization: Bearer token" unless token is "",
// and returns the status code and body.
func adminDo(t *testing.T, method, url, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// metricFamilies scrapes /metrics and parses it as Prometheus does.
func metricFamilies(t *testing.T, admin string) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := adminDo(t, "GET", "http://"+admin+"/metrics", "")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", code, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// metricSample is the sum of the values of the series of name whose labels include labels
// (name, value, …), or -1 when there is none.
func metricSample(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	f, ok := fams[name]
	if !ok {
		return -1
	}
	sum, found := 0.0, false
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(labels); i += 2 {
			if have[labels[i]] != labels[i+1] {
				continue next
			}
		}
		found = true
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		default:
			sum += m.GetUntyped().GetValue()
		}
	}
	if !found {
		return -1
	}
	return sum
}

// pollUntil waits until cond is true (see poll), failing the test, named by what, after 20 s.
func pollUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !poll(20*time.Second, cond) {
		t.Fatalf("after 20s: %s", what)
	}
}

// dialConn is a text connection to addr.
func dialConn(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// binaryPacket is a binary request packet with no key, extras or value.
func binaryPacket(opcode uint8, opaque uint32) []byte {
	p := make([]byte, 24)
	p[0], p[1] = 0x80, opcode
	binary.BigEndian.PutUint32(p[12:], opaque)
	return p
}

// binaryRoundTrip sends req and reads answer packets, whole, until one for stopOpcode.
func binaryRoundTrip(t *testing.T, addr string, req []byte, stopOpcode uint8) []byte {
	t.Helper()
	c, r := dialConn(t, addr)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	var out []byte
	for {
		hdr := make([]byte, 24)
		if _, err := io.ReadFull(r, hdr); err != nil {
			t.Fatalf("binary answer from %s: %v (so far %q)", addr, err, out)
		}
		body := make([]byte, binary.BigEndian.Uint32(hdr[8:]))
		if _, err := io.ReadFull(r, body); err != nil {
			t.Fatal(err)
		}
		out = append(append(out, hdr...), body...)
		if hdr[1] == stopOpcode {
			return out
		}
	}
}

func TestMetricsOperatorView(t *testing.T) {
	mc, flaky, oldMC, newMC := memcachedtest.Start(t), memcachedtest.Start(t), memcachedtest.Start(t), memcachedtest.Start(t)
	seed, seedR := dialConn(t, oldMC.Addr)
	const seeded = 30
	for i := range seeded {
		roundTrip(t, seed, seedR, fmt.Sprintf("set seed%d 0 0 1\r\nx\r\n", i), "STORED")
	}
	good := fmt.Sprintf(`limits:
  max_connections: 4
pools:
  main:
    timeout: 2s
    servers:
      - %q
      - name: moving
        addr: %q
        migrate_from: %q
  flaky:
    timeout: 300ms
    retries: 0
    failover: false
    servers: [%q]
  next:
    embedded: 1
    warm_from: main
    shadow: {pool: main, fraction: 0.01}
routes:
  - prefix: "flaky:"
    pool: flaky
default_pool: main
`, mc.Addr, newMC.Addr, oldMC.Addr, flaky.Addr)
	path := writeConfig(t, good)
	admin := freeAddr(t)
	p := startMoxi(t, "--config", path, "--admin", admin)
	if err := memcachedtest.WaitListening(admin, 10*time.Second); err != nil {
		t.Fatalf("admin: %v\n%s", err, p.out.String())
	}

	// The migration's gauges are still there after it is done.
	pollUntil(t, "the migration is done", func() bool {
		ms := migrations(t, admin)
		return len(ms) == 1 && ms[0].Phase == "done"
	})
	before := metricFamilies(t, admin)
	for _, c := range []struct {
		labels []string
		name   string
		want   float64
	}{
		{[]string{"pool", "main", "server", "moving", "phase", "done"}, "moxi_migration_phase", 1},
		{[]string{"pool", "main", "server", "moving", "phase", "copying"}, "moxi_migration_phase", 0},
		{[]string{"pool", "main", "server", "moving"}, "moxi_migration_keys_listed", seeded},
	} {
		if got := metricSample(before, c.name, c.labels...); got != c.want {
			t.Errorf("after done: %s%q = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if got := metricSample(before, "moxi_migration_keys_copied", "pool", "main", "server", "moving"); got < 1 || got > seeded {
		t.Errorf("after done: moxi_migration_keys_copied = %v, want 1 to %d", got, seeded)
	}

	// Build info: labelled with the version moxi answers and the Go it was built with.
	c, r := dialConn(t, p.addr)
	version := askLine(t, c, r, "version\r\n")
	if metricSample(before, "moxi_build_info", "goversion", runtime.Version()) != 1 {
		t.Errorf("moxi_build_info: %v, want goversion %s", before["moxi_build_info"], runtime.Version())
	} else if v := labelValue(before["moxi_build_info"].GetMetric()[0].GetLabel(), "version"); v == "" || version != versionLine(v) {
		t.Errorf("moxi_build_info version %q; moxi answers %q, want %q", v, version, versionLine(v))
	}
	if metricSample(before, "moxi_config_last_reload_successful") != 1 || metricSample(before, "moxi_config_last_reload_success_timestamp_seconds") < float64(time.Now().Add(-time.Hour).Unix()) {
		t.Errorf("at start: last reload successful %v at %v", metricSample(before, "moxi_config_last_reload_successful"), metricSample(before, "moxi_config_last_reload_success_timestamp_seconds"))
	}

	// Hits and misses, keys of every protocol: text get of 3 keys (2 hits), binary get (a
	// miss), mg (a hit and a miss).
	roundTrip(t, c, r, "set a 0 0 1\r\n1\r\n", "STORED")
	roundTrip(t, c, r, "set b 0 0 1\r\n2\r\n", "STORED")
	roundTrip(t, c, r, "get a b nothere\r\n", "END")
	roundTrip(t, c, r, "mg a v\r\n", "1")
	roundTrip(t, c, r, "mg nothere v\r\n", "EN")
	get := binaryPacket(0x00, 1) // get "missing", then a noop
	binary.BigEndian.PutUint16(get[2:], 7)
	binary.BigEndian.PutUint32(get[8:], 7)
	get = append(append(get, "missing"...), binaryPacket(0x0a, 2)...)
	if a := binaryRoundTrip(t, p.addr, get, 0x0a); binary.BigEndian.Uint16(a[6:]) != 0x0001 {
		t.Errorf("binary get of a missing key: status %#x", binary.BigEndian.Uint16(a[6:]))
	}

	// Error answers: a dead server with failover off (SERVER_ERROR naming it once), an
	// unknown command (ERROR), a malformed one (CLIENT_ERROR).
	flaky.Stop()
	lines := roundTrip(t, c, r, "get flaky:k\r\n", "END")
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "SERVER_ERROR backend "+flaky.Addr+": ") || strings.Count(last, flaky.Addr) != 1 {
		t.Errorf("get from a dead server: %q, want SERVER_ERROR naming %s once", last, flaky.Addr)
	}
	roundTrip(t, c, r, "bogus\r\n", "ERROR")
	roundTrip(t, c, r, "incr a notanumber\r\n", "CLIENT_ERROR")

	// Connections past max_connections (4: c, the binary one, two more) are rejected. The
	// fourth answering shows the third was accepted before it.
	dialConn(t, p.addr)
	x, xr := dialConn(t, p.addr)
	if v := askLine(t, x, xr, "version\r\n"); !strings.HasPrefix(v, "VERSION") {
		t.Fatalf("4th connection: %q", v)
	}
	over, overR := dialConn(t, p.addr)
	_ = over.SetDeadline(time.Now().Add(10 * time.Second))
	if line, _ := overR.ReadString('\n'); line != "SERVER_ERROR too many connections\r\n" {
		t.Errorf("connection past max_connections: %q", line)
	}

	// A reload that fails, then one that succeeds.
	if err := os.WriteFile(path, []byte("pools: {main: {servers: [nope]}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _ := adminDo(t, "POST", "http://"+admin+"/reload", ""); code != http.StatusBadRequest {
		t.Errorf("reload of a bad file: %d", code)
	}
	failed := metricFamilies(t, admin)
	if got := metricSample(failed, "moxi_config_last_reload_successful"); got != 0 {
		t.Errorf("after a failed reload: moxi_config_last_reload_successful = %v", got)
	}

	after := metricFamilies(t, admin)
	for _, f := range operatorMetrics {
		if _, ok := after[f]; !ok {
			t.Errorf("/metrics has no %s", f)
		}
	}
	delta := func(name string, labels ...string) float64 {
		return metricSample(after, name, labels...) - max(metricSample(before, name, labels...), 0)
	}
	for _, c := range []struct {
		name    string
		labels  []string
		want    float64
		atLeast bool // want is a floor: other traffic may add to it
	}{
		{"moxi_get_hits_total", nil, 3, false},   // a, b, mg a
		{"moxi_get_misses_total", nil, 3, false}, // nothere twice, binary missing (flaky:k failed: neither)
		{"moxi_error_answers_total", []string{"kind", "server_error"}, 1, false},
		{"moxi_error_answers_total", []string{"kind", "error"}, 1, false},
		{"moxi_error_answers_total", []string{"kind", "client_error"}, 1, false},
		{"moxi_connections_total", []string{"result", "rejected"}, 1, true},
		{"moxi_connections_total", []string{"result", "accepted"}, 4, true},
		{"moxi_config_reloads_total", []string{"result", "error"}, 1, false},
	} {
		got := delta(c.name, c.labels...)
		if got != c.want && !(c.atLeast && got >= c.want) {
			t.Errorf("%s%q moved by %v, want %v", c.name, c.labels, got, c.want)
		}
	}

	// Back to the good file (the same servers: none to retire at exit): successful again,
	// with a later timestamp.
	if err := os.WriteFile(path, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, body := adminDo(t, "POST", "http://"+admin+"/reload", ""); code != http.StatusOK {
		t.Fatalf("reload: %d %s", code, body)
	}
	ok := metricFamilies(t, admin)
	if metricSample(ok, "moxi_config_last_reload_successful") != 1 ||
		metricSample(ok, "moxi_config_last_reload_success_timestamp_seconds") < metricSample(before, "moxi_config_last_reload_success_timestamp_seconds") {
		t.Errorf("after a good reload: successful %v at %v (start %v)", metricSample(ok, "moxi_config_last_reload_successful"),
			metricSample(ok, "moxi_config_last_reload_success_timestamp_seconds"), metricSample(before, "moxi_config_last_reload_success_timestamp_seconds"))
	}
}

// askLine sends req and reads one answer line, without its "\r\n".
func askLine(t *testing.T, c net.Conn, r *bufio.Reader, req string) string {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	l, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("after %q: %v", req, err)
	}
	return strings.TrimSuffix(l, "\r\n")
}

func labelValue(labels []*dto.LabelPair, name string) string {
	for _, l := range labels {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestReadyz: 200 while a pool has a live server, its body giving each pool's live
// servers, so that one dead pool does not take the others out of service; 503 once a pool
// named in readiness.pools has none, failover or not; 503 during the drain after SIGTERM
// while /healthz stays 200.
func TestReadyz(t *testing.T) {
	t.Parallel() // mostly waits for instants and polls: runs beside the other such tests
	for _, failover := range []bool{false, true} {
		t.Run(fmt.Sprintf("failover %v", failover), func(t *testing.T) {
			up, doomed := memcachedtest.Start(t), memcachedtest.Start(t)
			config := fmt.Sprintf(`pools:
  main:
    servers: [%q]
  other:
    timeout: 200ms
    failure_limit: 1
    failover: %v
    servers: [%q]
default_pool: main
routes:
  - prefix: "other:"
    pool: other
`, up.Addr, failover, doomed.Addr)
			path := writeConfig(t, config)
			admin := freeAddr(t)
			p := startMoxi(t, "--config", path, "--admin", admin)
			if err := memcachedtest.WaitListening(admin, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			readyz := "http://" + admin + "/readyz"
			pollUntil(t, "/readyz 200 with every server up", func() bool { code, _ := adminDo(t, "GET", readyz, ""); return code == 200 })
			doomed.Stop()
			c, r := dialConn(t, p.addr)
			const pools = "pool main: 1 of 1 servers live\npool other: 0 of 1 servers live\n"
			var code int
			var body string
			pollUntil(t, "/readyz naming pool other's server dead", func() bool {
				roundTrip(t, c, r, "get other:k\r\n", "END") // a failure marks it dead at once
				code, body = adminDo(t, "GET", readyz, "")
				return strings.Contains(body, "pool other: 0")
			})
			if code != 200 || body != "ready\n"+pools {
				t.Errorf("/readyz with pool other dead and main live = %d %q, want 200 %q", code, body, "ready\n"+pools)
			}
			roundTrip(t, c, r, "set k 0 0 1\r\nv\r\n", "STORED")
			if got := roundTrip(t, c, r, "get k\r\n", "END"); !slices.Equal(got, []string{"VALUE k 0 1", "v", "END"}) {
				t.Errorf("get k from pool main with pool other dead: %q", got)
			}

			if err := os.WriteFile(path, []byte(config+"readiness:\n  pools: [other]\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if code, body := postReload(t, admin); code != 200 {
				t.Fatalf("reload with readiness.pools: %d %s", code, body)
			}
			wantNotReady(t, admin, "with readiness.pools [other] and pool other's server dead", "no live server in pool other (readiness.pools)\n"+pools, nil)
		})
	}

	t.Run("drain", func(t *testing.T) {
		mc := memcachedtest.Start(t)
		// The timeout outlasts the test's steps: the held get must still be in flight.
		path := writeConfig(t, fmt.Sprintf("shutdown_timeout: 30s\npools:\n  main:\n    timeout: 20s\n    retries: 0\n    servers: [%q]\n", mc.Addr))
		admin := freeAddr(t)
		p := startMoxi(t, "--config", path, "--admin", admin)
		if err := memcachedtest.WaitListening(admin, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		readyz := "http://" + admin + "/readyz"
		pollUntil(t, "/readyz 200", func() bool { code, _ := adminDo(t, "GET", readyz, ""); return code == 200 })
		// Each connection that comes up has moxi ask the server for its start instant
		// (stats): one still unanswered when memcached stops would stay in flight beside
		// the get. So all four connections are up and nothing is in flight first, across
		// a round trip of a client's.
		quiet := func() bool {
			_, body := adminDo(t, "GET", "http://"+admin+"/servers", "")
			return strings.Contains(body, `"connections": 4`) && strings.Contains(body, `"in_flight": 0`)
		}
		pollUntil(t, "every connection up, nothing in flight", quiet)
		c0, r0 := dialConn(t, p.addr)
		roundTrip(t, c0, r0, "get warm\r\n", "END")
		pollUntil(t, "nothing in flight after a get", quiet)

		// A request held in flight by a stopped memcached keeps the drain going.
		if err := mc.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		waitStopped(t, mc.Addr) // else a worker thread may still answer the get
		stopped := true
		defer func() {
			if stopped {
				_ = mc.Signal(syscall.SIGCONT)
			}
		}()
		c, r := dialConn(t, p.addr)
		if _, err := c.Write([]byte("get held\r\n")); err != nil {
			t.Fatal(err)
		}
		var servers string
		if !poll(20*time.Second, func() bool {
			_, servers = adminDo(t, "GET", "http://"+admin+"/servers", "")
			return strings.Contains(servers, `"in_flight": 1`)
		}) {
			t.Fatalf("after 20s the get is not in flight: GET /servers = %s", servers)
		}
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		wantNotReady(t, admin, "while draining", "draining: moxi is shutting down\npool main: 1 of 1 servers live\n", nil)
		_ = mc.Signal(syscall.SIGCONT)
		stopped = false
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if line, err := r.ReadString('\n'); line != "END\r\n" {
			t.Errorf("the get held through the drain: %q %v", line, err)
		}
		select {
		case <-p.exited:
		case <-time.After(15 * time.Second):
			t.Error("moxi did not exit after the drain")
		}
	})
}

// TestAdminToken: with admin_token_file, /reload and /config need the token, /metrics,
// /healthz and /readyz do not; a reload reads a rotated token.
func TestAdminToken(t *testing.T) {
	mc := memcachedtest.Start(t)
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("first-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := writeConfig(t, fmt.Sprintf("admin_token_file: %q\nwatch_config: false\n", token)+poolConfig("", mc.Addr))
	admin := freeAddr(t)
	startMoxi(t, "--config", path, "--admin", admin)
	if err := memcachedtest.WaitListening(admin, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	base := "http://" + admin
	for _, c := range []struct {
		method, path, token string
		code                int
	}{
		{"POST", "/reload", "", 401},
		{"POST", "/reload", "wrong", 401},
		{"GET", "/config", "", 401},
		{"GET", "/servers", "", 401},
		{"GET", "/config", "first-token", 200},
		{"GET", "/metrics", "", 200},
		{"GET", "/healthz", "", 200},
		{"GET", "/readyz", "", 200},
	} {
		if code, body := adminDo(t, c.method, base+c.path, c.token); code != c.code {
			t.Errorf("%s %s with token %q: %d %q, want %d", c.method, c.path, c.token, code, body, c.code)
		}
	}
	if err := os.WriteFile(token, []byte("second-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, body := adminDo(t, "POST", base+"/reload", "first-token"); code != 200 {
		t.Fatalf("POST /reload with the token: %d %q", code, body)
	}
	if code, _ := adminDo(t, "GET", base+"/config", "first-token"); code != 401 {
		t.Errorf("the old token after rotation: %d, want 401", code)
	}
	if code, body := adminDo(t, "GET", base+"/config", "second-token"); code != 200 || !strings.Contains(body, "admin_token_file:") {
		t.Errorf("GET /config with the new token: %d %q", code, body)
	}
}

// TestFlushAllRefused: with allow_flush_all false, moxi answers flush_all and binary
// flush/flushq byte for byte as memcached -F does, and nothing is flushed.
func TestFlushAllRefused(t *testing.T) {
	refusing := memcachedtest.Start(t, "-F")
	mc := memcachedtest.Start(t)
	admin := freeAddr(t)
	path := writeConfig(t, "limits:\n  allow_flush_all: false\n"+poolConfig("", mc.Addr))
	p := startMoxi(t, "--config", path, "--admin", admin)
	for _, addr := range []string{refusing.Addr, p.addr} {
		c, r := dialConn(t, addr)
		roundTrip(t, c, r, "set kept 0 0 1\r\nv\r\n", "STORED")
	}

	text := []struct{ req, last string }{
		{"flush_all\r\n", "OK"},
		{"flush_all 0\r\n", "OK"},
		{"flush_all noreply\r\nmn\r\n", "MN"}, // nothing, as memcached under noreply
	}
	for _, tc := range text {
		var answers [2][]string
		for i, addr := range []string{refusing.Addr, p.addr} {
			c, r := dialConn(t, addr)
			answers[i] = roundTrip(t, c, r, tc.req, tc.last)
		}
		if strings.Join(answers[0], "|") != strings.Join(answers[1], "|") {
			t.Errorf("%q: moxi %q, memcached -F %q", tc.req, answers[1], answers[0])
		}
	}
	for _, opcode := range []uint8{0x08, 0x18} { // flush, flushq; a noop ends each
		req := append(binaryPacket(opcode, 0x1234), binaryPacket(0x0a, 0x5678)...)
		want := binaryRoundTrip(t, refusing.Addr, req, 0x0a)
		if got := binaryRoundTrip(t, p.addr, req, 0x0a); string(got) != string(want) {
			t.Errorf("binary opcode %#x: moxi %q, memcached -F %q", opcode, got, want)
		}
	}
	c, r := dialConn(t, p.addr)
	if lines := roundTrip(t, c, r, "get kept\r\n", "END"); len(lines) != 3 {
		t.Errorf("after refused flushes: get kept = %q", lines)
	}
	if lines := roundTrip(t, c, r, "stats settings\r\n", "END"); !containsLine(lines, "STAT flush_enabled no") {
		t.Errorf("stats settings: no flush_enabled no in %q", lines)
	}
}

func containsLine(lines []string, want string) bool {
	for _, l := range lines {
		if l == want {
			return true
		}
	}
	return false
}

// wantNotReady polls /readyz until it answers 503 (calling nudge before each try, when
// given), then checks that its body is want and that /healthz, liveness, still answers 200.
func wantNotReady(t *testing.T, admin, when, want string, nudge func()) {
	t.Helper()
	var body string
	pollUntil(t, "/readyz 503 "+when, func() bool {
		if nudge != nil {
			nudge()
		}
		var code int
		code, body = adminDo(t, "GET", "http://"+admin+"/readyz", "")
		return code == http.StatusServiceUnavailable
	})
	if body != want {
		t.Errorf("/readyz body %s: %q, want %q", when, body, want)
	}
	if code, _ := adminDo(t, "GET", "http://"+admin+"/healthz", ""); code != 200 {
		t.Errorf("/healthz %s = %d, want 200", when, code)
	}
}

// TestMetricsPerPool: with metrics.per_server false the moxi_backend_* series are one per
// pool, summing its servers and up while one of them is; metrics.latency_buckets are the
// request-duration histograms' buckets.
func TestMetricsPerPool(t *testing.T) {
	t.Parallel()
	a, b, doomed := memcachedtest.Start(t), memcachedtest.Start(t), memcachedtest.Start(t)
	path := writeConfig(t, fmt.Sprintf(`metrics:
  per_server: false
  latency_buckets: [0.001, 0.1]
pools:
  main:
    servers: [%q, %q]
  other:
    timeout: 200ms
    failure_limit: 1
    failover: false
    servers: [%q]
default_pool: main
routes:
  - prefix: "other:"
    pool: other
`, a.Addr, b.Addr, doomed.Addr))
	admin := freeAddr(t)
	p := startMoxi(t, "--config", path, "--admin", admin)
	if err := memcachedtest.WaitListening(admin, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	c, r := dialConn(t, p.addr)
	const keys = 20
	for i := range keys {
		roundTrip(t, c, r, fmt.Sprintf("set k%d 0 0 1\r\nv\r\n", i), "STORED")
	}
	doomed.Stop()
	pollUntil(t, "pool other marked dead", func() bool {
		roundTrip(t, c, r, "get other:k\r\n", "END")
		return metricSample(metricFamilies(t, admin), "moxi_backend_up", "pool", "other") == 0
	})
	fams := metricFamilies(t, admin)
	for _, name := range []string{"moxi_backend_up", "moxi_backend_requests_total", "moxi_backend_errors_total", "moxi_backend_request_duration_seconds"} {
		f := fams[name]
		if f == nil {
			t.Errorf("no %s", name)
			continue
		}
		pools := map[string]bool{}
		for _, m := range f.GetMetric() {
			if s := labelValue(m.GetLabel(), "server"); s != "" {
				t.Errorf("%s has a server label (%s) with per_server false", name, s)
			}
			pools[labelValue(m.GetLabel(), "pool")] = true
		}
		switch name {
		case "moxi_backend_up", "moxi_backend_requests_total":
			if !pools["main"] || !pools["other"] {
				t.Errorf("%s: pools %v, want main and other", name, pools)
			}
		case "moxi_backend_errors_total": // a kind's series exists once it happened
			if !pools["other"] || pools["main"] {
				t.Errorf("%s: pools %v, want other's failures alone", name, pools)
			}
		}
	}
	if up := metricSample(fams, "moxi_backend_up", "pool", "main"); up != 1 {
		t.Errorf("moxi_backend_up{pool=main} = %v, want 1", up)
	}
	if n := metricSample(fams, "moxi_backend_requests_total", "pool", "main"); n < keys {
		t.Errorf("moxi_backend_requests_total{pool=main} = %v, want at least the %d sets over both servers", n, keys)
	}
	for _, name := range []string{"moxi_request_duration_seconds", "moxi_backend_request_duration_seconds"} {
		f := fams[name]
		if f == nil || len(f.GetMetric()) == 0 {
			t.Errorf("no %s", name)
			continue
		}
		var bounds []float64
		for _, bk := range f.GetMetric()[0].GetHistogram().GetBucket() {
			bounds = append(bounds, bk.GetUpperBound())
		}
		if !slices.Equal(bounds, []float64{0.001, 0.1, math.Inf(1)}) {
			t.Errorf("%s buckets %v, want [0.001 0.1] (metrics.latency_buckets)", name, bounds)
		}
	}
}

// TestConfigInfoDrift: two proxies in front of the same server export one config hash when
// they run the same file and two when their files differ, until a reload makes them agree.
func TestConfigInfoDrift(t *testing.T) {
	t.Parallel()
	mc := memcachedtest.Start(t)
	plain := fmt.Sprintf("pools:\n  main:\n    servers: [%q]\n", mc.Addr)
	hot := plain + "hot_cache:\n  prefixes: [\"hot:\"]\n"
	hashOf := func(admin string) string {
		f := metricFamilies(t, admin)["moxi_config_info"]
		if f == nil || len(f.GetMetric()) != 1 {
			t.Fatalf("moxi_config_info on %s: %v", admin, f)
		}
		return labelValue(f.GetMetric()[0].GetLabel(), "hash")
	}
	var admins, paths []string
	for _, cfg := range []string{plain, hot} {
		path, admin := writeConfig(t, cfg), freeAddr(t)
		startMoxi(t, "--config", path, "--admin", admin)
		if err := memcachedtest.WaitListening(admin, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		admins, paths = append(admins, admin), append(paths, path)
	}
	if a, b := hashOf(admins[0]), hashOf(admins[1]); a == b {
		t.Errorf("proxies with different files export one hash %s", a)
	}
	if err := os.WriteFile(paths[1], []byte(plain), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, body := postReload(t, admins[1]); code != 200 {
		t.Fatalf("reload: %d %s", code, body)
	}
	if a, b := hashOf(admins[0]), hashOf(admins[1]); a != b {
		t.Errorf("proxies running the same file export hashes %s and %s", a, b)
	}
}

// TestSeriesCount: a proxy with 2 pools of 5 servers in all, after traffic on 5 commands,
// exports at most 240 moxi_* series with the defaults (each histogram bucket, sum and count
// one series, as Prometheus stores them; the latency of each pool as its clients see it
// takes 13 a pool), and fewer with metrics.per_server false.
func TestSeriesCount(t *testing.T) {
	t.Parallel()
	mcs := cluster(t, 5)
	count := func(settings string) (n int, families map[string]int) {
		path := writeConfig(t, fmt.Sprintf(`%spools:
  main:
    servers: [%q, %q, %q]
  other:
    servers: [%q, %q]
default_pool: main
routes:
  - prefix: "other:"
    pool: other
`, settings, mcs[0].Addr, mcs[1].Addr, mcs[2].Addr, mcs[3].Addr, mcs[4].Addr))
		admin := freeAddr(t)
		p := startMoxi(t, "--config", path, "--admin", admin)
		if err := memcachedtest.WaitListening(admin, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		c, r := dialConn(t, p.addr)
		for i := range 20 {
			for _, k := range []string{fmt.Sprintf("k%d", i), fmt.Sprintf("other:k%d", i)} {
				roundTrip(t, c, r, "set "+k+" 0 0 1\r\n1\r\n", "STORED")
				roundTrip(t, c, r, "get "+k+"\r\n", "END")
				roundTrip(t, c, r, "incr "+k+" 1\r\n", "2")
				roundTrip(t, c, r, "touch "+k+" 0\r\n", "TOUCHED")
				roundTrip(t, c, r, "delete "+k+"\r\n", "DELETED")
			}
		}
		families = map[string]int{}
		for name, f := range metricFamilies(t, admin) {
			if !strings.HasPrefix(name, "moxi_") {
				continue
			}
			for _, m := range f.GetMetric() {
				series := 1
				if h := m.GetHistogram(); h != nil {
					series = len(h.GetBucket()) + 2 // each bucket (+Inf among them), the sum and the count
				}
				n += series
				families[name] += series
			}
		}
		return n, families
	}
	byServer, families := count("")
	byPool, _ := count("metrics:\n  per_server: false\n")
	t.Logf("moxi_* series, 2 pools, 5 servers, 5 commands: %d per server (the default), %d with per_server false", byServer, byPool)
	if byServer > 240 {
		t.Errorf("%d moxi_* series with the defaults, want at most 240; by family: %v", byServer, families)
	}
	if byPool >= byServer {
		t.Errorf("per_server false: %d series, not fewer than the %d per server", byPool, byServer)
	}
}
