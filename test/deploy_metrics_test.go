package test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/moxi-proxy/moxi/internal/dnstest"
	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// exportedFamilies is every metric family moxi exports (beside the Go runtime's go_* and
// process_*): its type and the labels each of its series carries, no more and no fewer.
// docs/operating.md describes them; the dashboard charts each one; TestDeployMetricNames
// ties the list to the names in the code, TestDeployMetricsExported to a running moxi.
var exportedFamilies = []exportedMetric{
	// Client requests (internal/proxy).
	{"moxi_requests_total", dto.MetricType_COUNTER, []string{"pool", "command"}},
	{"moxi_request_duration_seconds", dto.MetricType_HISTOGRAM, []string{"command"}},
	{"moxi_pool_request_duration_seconds", dto.MetricType_HISTOGRAM, []string{"pool"}},
	{"moxi_error_answers_total", dto.MetricType_COUNTER, []string{"pool", "kind"}},
	{"moxi_get_hits_total", dto.MetricType_COUNTER, []string{"pool"}},
	{"moxi_get_misses_total", dto.MetricType_COUNTER, []string{"pool"}},
	{"moxi_dedup_coalesced_total", dto.MetricType_COUNTER, nil},
	{"moxi_hotcache_hits_total", dto.MetricType_COUNTER, nil},
	{"moxi_hotcache_misses_total", dto.MetricType_COUNTER, nil},
	{"moxi_hotcache_invalidations_total", dto.MetricType_COUNTER, []string{"source"}},
	// Hot keys and the tier's hot caches (internal/admin, internal/peers).
	{"moxi_hot_key_share", dto.MetricType_GAUGE, []string{"pool"}},
	{"moxi_peer_invalidations_total", dto.MetricType_COUNTER, []string{"peer", "result"}},
	// Upgrades in place (cmd/moxi).
	{"moxi_upgrades_total", dto.MetricType_COUNTER, []string{"result"}},
	// The request log (internal/reqlog).
	{"moxi_requests_stream_dropped_total", dto.MetricType_COUNTER, nil},
	{"moxi_fire_and_forget_pending", dto.MetricType_GAUGE, nil},
	{"moxi_fire_and_forget_written_total", dto.MetricType_COUNTER, nil},
	{"moxi_fire_and_forget_failed_total", dto.MetricType_COUNTER, nil},
	// Client connections (internal/frontend).
	{"moxi_connections_current", dto.MetricType_GAUGE, nil},
	{"moxi_connections_total", dto.MetricType_COUNTER, []string{"result"}},
	{"moxi_connections_closed_total", dto.MetricType_COUNTER, []string{"reason"}},
	{"moxi_buffered_bytes", dto.MetricType_GAUGE, nil},
	{"moxi_panics_total", dto.MetricType_COUNTER, nil},
	{"moxi_auth_failures_total", dto.MetricType_COUNTER, nil},
	{"moxi_user_requests_total", dto.MetricType_COUNTER, []string{"user"}},
	{"moxi_rate_limited_total", dto.MetricType_COUNTER, []string{"user"}},
	// Backends (internal/admin, cmd/moxi).
	{"moxi_backend_up", dto.MetricType_GAUGE, []string{"pool", "server"}},
	{"moxi_backend_requests_total", dto.MetricType_COUNTER, []string{"pool", "server"}},
	{"moxi_backend_errors_total", dto.MetricType_COUNTER, []string{"pool", "server", "kind"}},
	{"moxi_backend_request_duration_seconds", dto.MetricType_HISTOGRAM, []string{"pool", "server"}},
	// Backup, warm-up and shadow pools (internal/route).
	{"moxi_backup_reads_total", dto.MetricType_COUNTER, nil},
	{"moxi_backup_hits_total", dto.MetricType_COUNTER, nil},
	{"moxi_backup_writes_total", dto.MetricType_COUNTER, nil},
	{"moxi_backup_write_errors_total", dto.MetricType_COUNTER, nil},
	{"moxi_backup_writes_dropped_total", dto.MetricType_COUNTER, nil},
	{"moxi_warmup_reads_total", dto.MetricType_COUNTER, []string{"pool", "result"}},
	{"moxi_shadow_requests_total", dto.MetricType_COUNTER, []string{"pool", "result"}},
	{"moxi_replica_repairs_total", dto.MetricType_COUNTER, []string{"pool"}},
	{"moxi_zone_reads_total", dto.MetricType_COUNTER, []string{"pool", "zone", "result"}},
	// Failover stand-ins (internal/admin).
	{"moxi_failover_keys_remembered", dto.MetricType_GAUGE, nil},
	{"moxi_failover_keys_remembered_max", dto.MetricType_GAUGE, nil},
	{"moxi_failover_keys_forgotten_total", dto.MetricType_COUNTER, nil},
	// Migrations (internal/admin).
	{"moxi_migration_keys_copied", dto.MetricType_GAUGE, []string{"pool", "server"}},
	{"moxi_migration_keys_listed", dto.MetricType_GAUGE, []string{"pool", "server"}},
	{"moxi_migration_phase", dto.MetricType_GAUGE, []string{"pool", "server", "phase"}},
	{"moxi_rebuild_keys_copied", dto.MetricType_GAUGE, []string{"pool", "server"}},
	// Servers from DNS (internal/discover).
	{"moxi_discovery_errors_total", dto.MetricType_COUNTER, []string{"pool"}},
	// Config reloads and the build (internal/reload, internal/admin).
	{"moxi_config_reloads_total", dto.MetricType_COUNTER, []string{"result"}},
	{"moxi_config_last_reload_successful", dto.MetricType_GAUGE, nil},
	{"moxi_config_last_reload_success_timestamp_seconds", dto.MetricType_GAUGE, nil},
	{"moxi_build_info", dto.MetricType_GAUGE, []string{"version", "goversion"}},
	{"moxi_config_info", dto.MetricType_GAUGE, []string{"hash"}},
}

type exportedMetric struct {
	name   string
	typ    dto.MetricType
	labels []string
}

// family finds the family of exportedFamilies that a series name a query uses belongs to:
// the family itself, or a histogram's _bucket, _sum or _count.
func family(name string) (exportedMetric, bool) {
	for _, m := range exportedFamilies {
		if name == m.name {
			return m, true
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if m.typ == dto.MetricType_HISTOGRAM && name == m.name+suffix {
				return m, true
			}
		}
	}
	return exportedMetric{}, false
}

// dashboard reads the Grafana dashboard as generic JSON.
func dashboard(t *testing.T) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(deployDir, "grafana", "moxi-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d map[string]any
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("moxi-dashboard.json: %v", err)
	}
	return d
}

// queries collects every string under a key named expr, query or definition: the panel
// queries and the template variables' queries.
func queries(v any, out *[]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && (k == "expr" || k == "query" || k == "definition") {
				*out = append(*out, s)
				continue
			}
			queries(x, out)
		}
	case []any:
		for _, x := range v {
			queries(x, out)
		}
	}
}

// dashboardInput is the data source the dashboard asks for on import (its __inputs). Grafana's
// import replaces ${DS_PROMETHEUS} with the one picked; a dashboard provisioned from the file
// (no import) resolves it as the template variable of that name instead.
const dashboardInput = "DS_PROMETHEUS"

// grafanaVars are the ${...} references Grafana itself defines.
var grafanaVars = regexp.MustCompile(`\$\{(__[a-z_]+)`)

func TestDeployDashboard(t *testing.T) {
	d := dashboard(t)
	if v, _ := d["schemaVersion"].(float64); v < 36 {
		t.Errorf("schemaVersion %v: want a current Grafana schema (36 or later)", d["schemaVersion"])
	}

	// Importable: the data source is an input, and __requires names what the panels need.
	inputs, _ := d["__inputs"].([]any)
	if !slices.ContainsFunc(inputs, func(v any) bool {
		m, _ := v.(map[string]any)
		return m["name"] == dashboardInput && m["type"] == "datasource" && m["pluginId"] == "prometheus"
	}) {
		t.Errorf("__inputs %v: want a datasource input %s for the prometheus plugin", d["__inputs"], dashboardInput)
	}
	required := map[string]bool{} // "type/id"
	reqs, _ := d["__requires"].([]any)
	for _, r := range reqs {
		m, _ := r.(map[string]any)
		required[fmt.Sprint(m["type"], "/", m["id"])] = true
	}
	for _, want := range []string{"grafana/grafana", "datasource/prometheus"} {
		if !required[want] {
			t.Errorf("__requires lacks %s (has %v)", want, slices.Sorted(maps.Keys(required)))
		}
	}

	tmpl, _ := d["templating"].(map[string]any)
	vars, _ := tmpl["list"].([]any)
	varNames := map[string]bool{dashboardInput: true}
	if !slices.ContainsFunc(vars, func(v any) bool {
		m, _ := v.(map[string]any)
		return m["name"] == dashboardInput && m["type"] == "datasource" && m["query"] == "prometheus"
	}) {
		t.Errorf("no datasource variable %s: a dashboard provisioned from the file would have no data source", dashboardInput)
	}
	for _, name := range []string{"job", "namespace", "instance", "pool"} {
		if !slices.ContainsFunc(vars, func(v any) bool {
			m, _ := v.(map[string]any)
			return m["name"] == name && m["type"] == "query"
		}) {
			t.Errorf("no query variable %s", name)
		}
	}
	for _, v := range vars {
		m, _ := v.(map[string]any)
		varNames[fmt.Sprint(m["name"])] = true
		if m["type"] == "query" {
			checkDatasource(t, fmt.Sprintf("variable %v", m["name"]), m["datasource"])
		}
	}
	// Every ${name} is an input, a variable or Grafana's own: anything else stays literal.
	raw, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`\$\{([A-Za-z0-9_]+)`).FindAllStringSubmatch(string(raw), -1) {
		if !varNames[m[1]] && !grafanaVars.MatchString(m[0]) {
			t.Errorf("${%s} is neither an input nor a variable of the dashboard", m[1])
		}
	}

	panels, _ := d["panels"].([]any)
	if len(panels) == 0 {
		t.Fatal("no panels")
	}
	ids := map[float64]bool{}
	var all []string // every panel query
	for _, p := range panels {
		m, _ := p.(map[string]any)
		id, _ := m["id"].(float64)
		if ids[id] {
			t.Errorf("panel %q: id %v is taken by another panel", m["title"], m["id"])
		}
		ids[id] = true
		switch m["type"] {
		case "timeseries", "stat":
			if !required["panel/"+m["type"].(string)] {
				t.Errorf("panel %q: type %v is not in __requires", m["title"], m["type"])
			}
		case "row":
			continue
		default:
			t.Errorf("panel %q: type %v, want timeseries or stat", m["title"], m["type"])
		}
		checkDatasource(t, fmt.Sprintf("panel %q", m["title"]), m["datasource"])
		targets, _ := m["targets"].([]any)
		for _, tg := range targets {
			tm, _ := tg.(map[string]any)
			checkDatasource(t, fmt.Sprintf("panel %q query %v", m["title"], tm["refId"]), tm["datasource"])
		}
		var exprs []string
		queries(targets, &exprs)
		if len(exprs) == 0 {
			t.Errorf("panel %q has no query", m["title"])
		}
		for _, e := range exprs {
			checkPanelSelectors(t, fmt.Sprint(m["title"]), e)
			all = append(all, e)
		}
	}

	// Every family moxi exports is charted: one a panel leaves out is one an operator never
	// sees move.
	charted := map[string]bool{}
	for _, e := range all {
		for _, name := range metricName.FindAllString(e, -1) {
			if f, ok := family(name); ok {
				charted[f.name] = true
			}
		}
	}
	for _, f := range exportedFamilies {
		if !charted[f.name] {
			t.Errorf("no panel queries %s", f.name)
		}
	}
}

// checkDatasource checks that a panel, query or variable uses the imported data source.
func checkDatasource(t *testing.T, what string, ds any) {
	t.Helper()
	m, _ := ds.(map[string]any)
	if m["type"] != "prometheus" || m["uid"] != "${"+dashboardInput+"}" {
		t.Errorf("%s: datasource %v, want {type: prometheus, uid: ${%s}}", what, ds, dashboardInput)
	}
}

var (
	metricName     = regexp.MustCompile(`moxi_[a-z0-9_]+`)
	metricSelector = regexp.MustCompile(`(moxi_[a-z0-9_]+)(\{[^}]*\})?`)
)

// checkPanelSelectors checks that every series a panel query selects is narrowed by the
// dashboard's variables: job, namespace and instance, and pool for series that have one.
func checkPanelSelectors(t *testing.T, panel, expr string) {
	t.Helper()
	for _, m := range metricSelector.FindAllStringSubmatch(expr, -1) {
		want := []string{`job=~"$job"`, `namespace=~"$namespace"`, `instance=~"$instance"`}
		if f, _ := family(m[1]); slices.Contains(f.labels, "pool") {
			want = append(want, `pool=~"$pool"`)
		}
		for _, w := range want {
			if !strings.Contains(m[2], w) {
				t.Errorf("panel %q: %s%s lacks %s", panel, m[1], m[2], w)
			}
		}
	}
}

// codeMetricName is a string literal in moxi's code that names a metric family.
var codeMetricName = regexp.MustCompile(`"(moxi_[a-z0-9_]+)"`)

// Every metric the dashboard and the alerts query is one moxi exports, and exportedFamilies
// is the list of the names the code gives its metrics, no more, no fewer; TestDeployMetricsExported
// then checks a running moxi against the list.
func TestDeployMetricNames(t *testing.T) {
	for name, files := range deployedMetrics(t) {
		if _, ok := family(name); !ok {
			t.Errorf("%s (used in %s) is not a metric family moxi exports", name, strings.Join(files, ", "))
		}
	}

	inCode := map[string]string{} // name → the file that names it
	for _, dir := range []string{"../internal", "../cmd"} {
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return err
			}
			src, err := os.ReadFile(p)
			for _, m := range codeMetricName.FindAllSubmatch(src, -1) {
				inCode[string(m[1])] = p
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(inCode) == 0 {
		t.Fatal(`found no "moxi_..." metric name in ../internal and ../cmd`)
	}
	listed := map[string]bool{}
	for _, f := range exportedFamilies {
		listed[f.name] = true
		if inCode[f.name] == "" {
			t.Errorf("%s is listed in exportedFamilies but no code names it (renamed or removed?)", f.name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(inCode)) {
		if !listed[name] {
			t.Errorf("%s (named in %s) is missing from exportedFamilies: add it with its type and labels, a dashboard panel and a line in docs/operating.md", name, inCode[name])
		}
	}
}

// deployedMetrics is every moxi metric name the dashboard and the alerts query, with the
// files that use it.
func deployedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	var dash []string
	queries(dashboard(t), &dash)
	var alerts []string
	for _, r := range alertRules(t) {
		alerts = append(alerts, r.Expr)
	}
	used := map[string][]string{}
	for file, exprs := range map[string][]string{"moxi-dashboard.json": dash, "alerts.yaml": alerts} {
		for _, e := range exprs {
			for _, name := range metricName.FindAllString(e, -1) {
				if !slices.Contains(used[name], file) {
					used[name] = append(used[name], file)
					slices.Sort(used[name])
				}
			}
		}
	}
	return used
}

// exercise sends moxi a request of each kind on the paths the metrics count: plain keys,
// a hit and a miss, a hot-cache key read twice, a fire-and-forget set, a key of a pool whose
// only server is down (an error answer), a key of a pool that warms up from another and is
// shadowed to it, and a reload.
func exercise(t *testing.T, addr, admin string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	steps := []struct{ req, last string }{
		{"set plain 0 0 1\r\n1\r\n", "STORED"},
		{"get plain\r\n", "END"},
		{"gets plain missing\r\n", "END"},
		{"incr plain 1\r\n", "2"},
		{"touch plain 100\r\n", "TOUCHED"},
		{"delete plain\r\n", "DELETED"},
		{"set hot:k 0 0 1\r\nh\r\n", "STORED"},
		{"get hot:k\r\n", "END"},
		{"get hot:k\r\n", "END"},
		{"set ff:k 0 0 1\r\nf\r\n", "STORED"},
		{"get ff:k\r\n", "END"},
		{"get down:k\r\n", "SERVER_ERROR"},
		{"get warm:k\r\n", "END"},
		{"set zoned:k 0 0 1\r\nz\r\n", "STORED"},
		{"get zoned:k\r\n", "END"},
	}
	for _, s := range steps {
		lines := roundTrip(t, c, r, s.req, s.last)
		if got := lines[len(lines)-1]; !strings.HasPrefix(got, s.last) {
			t.Fatalf("%q: got %q", s.req, lines)
		}
	}
	// A reload request makes moxi_config_reloads_total{result} exist; its outcome does not
	// matter here.
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Post("http://"+admin+"/reload", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

// exported reports whether name is a series moxi exports: a family, or a histogram's
// _bucket/_sum/_count series.
func exported(fams map[string]*dto.MetricFamily, name string) bool {
	if _, ok := fams[name]; ok {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if f, ok := fams[base]; ok && (f.GetType() == dto.MetricType_HISTOGRAM || (suffix != "_bucket" && f.GetType() == dto.MetricType_SUMMARY)) {
				return true
			}
		}
	}
	return false
}

// A moxi with every feature that has metrics (a migration, a pool without a live server, a
// hot cache, fire-and-forget, a pool that warms up from another and shadows to it) exports
// exactly exportedFamilies, each with its type and labels, and every metric the deployment
// files query.
// peerToken writes a hot_cache.peer_token_file and returns its path.
func peerToken(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "peer-token")
	if err := os.WriteFile(path, []byte("tier-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestDeployMetricsExported(t *testing.T) {
	t.Parallel() // mostly waits (timers, expiries, child tools): beside the other waiting tests
	used := deployedMetrics(t)
	if len(used) < 8 {
		t.Fatalf("the dashboard and alerts use only %d moxi metrics: %v", len(used), used)
	}

	mc, oldMC, newMC := memcachedtest.Start(t), memcachedtest.Start(t), memcachedtest.Start(t)
	// A pool of two zones, whose second zone's server restarts below: its rebuild's gauge.
	zoneA, zoneB := memcachedtest.Start(t), memcachedtest.Start(t)
	born := time.Now()
	// Keys on the old server of a migrating slot, copied at 1 key/s, keep the migration in
	// phase copying for the whole test so that its gauge exists.
	seed, err := net.DialTimeout("tcp", oldMC.Addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	seedR := bufio.NewReader(seed)
	for i := range 20 {
		roundTrip(t, seed, seedR, fmt.Sprintf("set seed%d 0 0 1\r\nx\r\n", i), "STORED")
	}
	seed.Close()

	// A pool that follows a DNS name: its errors counter exists from the start.
	dns := dnstest.Start(t)
	dns.SetIPs("found.test", "127.0.0.1")
	_, mcPort, _ := net.SplitHostPort(mc.Addr)

	cfg := writeConfig(t, fmt.Sprintf(`pools:
  found:
    discover: {dns: found.test., port: %s, resolver: %q}
  main:
    timeout: 2s
    migrate_rate: 1
    servers:
      - %q
      - name: migrating
        addr: %q
        migrate_from: %q
  down:
    timeout: 250ms
    failover: false
    servers: [%q]
  warm:
    embedded: 1
    warm_from: main
    shadow: {pool: main, fraction: 1}
  zoned:
    zones:
      - {name: a, servers: [%q]}
      - {name: b, servers: [%q]}
default_pool: main
routes:
  - prefix: "down:"
    pool: down
  - prefix: "warm:"
    pool: warm
  - prefix: "zoned:"
    pool: zoned
hot_cache:
  prefixes: ["hot:"]
  peers: [%q]
  peer_token_file: %q
hot_keys: {}
fire_and_forget:
  prefixes: ["ff:"]
`, mcPort, dns.Addr, mc.Addr, newMC.Addr, oldMC.Addr, freeAddr(t), zoneA.Addr, zoneB.Addr, freeAddr(t), peerToken(t)))
	admin := freeAddr(t)
	p := startMoxi(t, "--config", cfg, "--admin", admin)
	if err := memcachedtest.WaitListening(admin, 5*time.Second); err != nil {
		t.Fatalf("admin: %v\n%s", err, p.out.String())
	}
	exercise(t, p.addr, admin)
	// A start instant moves by whole seconds: restarted 2.5 s after its start, the zoned
	// pool's server is seen to have restarted, and rebuilt.
	pollUntil(t, "2.5 s of the zoned pool's servers", func() bool { return time.Since(born) > 2500*time.Millisecond })
	zoneB.Restart(t)
	// The shadow copy of warm:k is sent after its answer, by a background worker.
	var fams map[string]*dto.MetricFamily
	pollUntil(t, "moxi counts the shadow request and lists the rebuild", func() bool {
		fams = metricFamilies(t, admin)
		return metricSample(fams, "moxi_shadow_requests_total", "pool", "warm") >= 0 && fams["moxi_rebuild_keys_copied"] != nil
	})

	var missing []string
	for _, name := range slices.Sorted(maps.Keys(used)) {
		if !exported(fams, name) {
			missing = append(missing, fmt.Sprintf("%s (used in %s)", name, strings.Join(used[name], ", ")))
		}
	}
	for _, m := range exportedFamilies {
		f, ok := fams[m.name]
		if !ok {
			missing = append(missing, m.name+" (exportedFamilies)")
			continue
		}
		if f.GetType() != m.typ {
			t.Errorf("%s is a %v, exportedFamilies says %v", m.name, f.GetType(), m.typ)
		}
		for _, s := range f.GetMetric() {
			var have []string
			for _, l := range s.GetLabel() {
				have = append(have, l.GetName())
			}
			if !slices.Equal(slices.Sorted(slices.Values(have)), slices.Sorted(slices.Values(m.labels))) {
				t.Errorf("%s series has labels %q, exportedFamilies says %q", m.name, have, m.labels)
				break
			}
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		t.Errorf("moxi does not export %d metric families the deployment files or exportedFamilies name:\n  %s", len(missing), strings.Join(missing, "\n  "))
	}
	for _, name := range slices.Sorted(maps.Keys(fams)) {
		if _, ok := family(name); strings.HasPrefix(name, "moxi_") && !ok {
			t.Errorf("moxi exports %s, which exportedFamilies lacks", name)
		}
	}
}
