package test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"gopkg.in/yaml.v3"

	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// The deployment files are checked against the code they deploy: the config they ship must
// load, the ports and paths they probe must be the ones moxi serves, and every metric a
// dashboard or an alert queries must be one the binary exports.

const (
	deployDir  = "../deploy"
	configsDir = "../configs"
)

// contractMetrics is the /metrics row of the CONTRACT: each family, its type and the labels
// every one of its series carries.
var contractMetrics = []struct {
	name   string
	typ    dto.MetricType
	labels []string
}{
	{"moxi_requests_total", dto.MetricType_COUNTER, []string{"command"}},
	{"moxi_request_duration_seconds", dto.MetricType_HISTOGRAM, nil},
	{"moxi_backend_requests_total", dto.MetricType_COUNTER, []string{"pool", "server"}},
	{"moxi_backend_errors_total", dto.MetricType_COUNTER, []string{"pool", "server", "kind"}},
	{"moxi_backend_up", dto.MetricType_GAUGE, []string{"pool", "server"}},
	{"moxi_connections_current", dto.MetricType_GAUGE, nil},
	{"moxi_dedup_coalesced_total", dto.MetricType_COUNTER, nil},
	{"moxi_hotcache_hits_total", dto.MetricType_COUNTER, nil},
	{"moxi_hotcache_misses_total", dto.MetricType_COUNTER, nil},
	{"moxi_fire_and_forget_pending", dto.MetricType_GAUGE, nil},
	{"moxi_config_reloads_total", dto.MetricType_COUNTER, []string{"result"}},
	{"moxi_migration_keys_copied", dto.MetricType_GAUGE, []string{"pool", "server"}},
}

// requiredAlerts are the alerts an operator of moxi can count on finding in alerts.yaml.
var requiredAlerts = []string{
	"MoxiDown", "MoxiBackendDown", "MoxiHighErrorRate", "MoxiMigrationStuck",
	"MoxiConfigReloadFailing", "MoxiFireAndForgetBacklog",
}

// yamlFiles lists the .yaml and .yml files under dirs.
func yamlFiles(t *testing.T, dirs ...string) []string {
	t.Helper()
	var out []string
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if ext := filepath.Ext(p); !d.IsDir() && (ext == ".yaml" || ext == ".yml") {
				out = append(out, p)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// yamlDocs decodes every document of a multi-document YAML file; empty documents are left out.
func yamlDocs(t *testing.T, file string) []*yaml.Node {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []*yaml.Node
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if len(n.Content) > 0 && n.Content[0].Kind != yaml.ScalarNode {
			docs = append(docs, &n)
		}
	}
}

func TestDeployYAMLParses(t *testing.T) {
	files := yamlFiles(t, deployDir, configsDir)
	if len(files) < 6 {
		t.Fatalf("found only %d YAML files under %s and %s: %q", len(files), deployDir, configsDir, files)
	}
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			if len(yamlDocs(t, f)) == 0 {
				t.Errorf("%s holds no YAML document", f)
			}
		})
	}
}

// The topologies shipped as files (not the ConfigMap's embedded one, checked with the
// Deployment) must load as they are.
func TestDeployConfigsLoad(t *testing.T) {
	for _, f := range yamlFiles(t, configsDir, filepath.Join(deployDir, "docker")) {
		t.Run(f, func(t *testing.T) {
			if _, err := config.Load(f); err != nil {
				t.Error(err)
			}
		})
	}
}

// k8sObject is the part of a Kubernetes object these tests read.
type k8sObject struct {
	APIVersion string            `yaml:"apiVersion"`
	Kind       string            `yaml:"kind"`
	Metadata   k8sMeta           `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`
	Spec       yaml.Node         `yaml:"spec"`
	file       string
}

type k8sMeta struct {
	Name        string            `yaml:"name"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type deploymentSpec struct {
	Replicas int `yaml:"replicas"`
	Template struct {
		Metadata k8sMeta `yaml:"metadata"`
		Spec     struct {
			TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
			SecurityContext               struct {
				RunAsNonRoot bool `yaml:"runAsNonRoot"`
			} `yaml:"securityContext"`
			Containers []k8sContainer `yaml:"containers"`
			Volumes    []struct {
				Name      string `yaml:"name"`
				ConfigMap *struct {
					Name string `yaml:"name"`
				} `yaml:"configMap"`
			} `yaml:"volumes"`
		} `yaml:"spec"`
	} `yaml:"template"`
}

type k8sContainer struct {
	Name           string    `yaml:"name"`
	Args           []string  `yaml:"args"`
	Ports          []k8sPort `yaml:"ports"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	Lifecycle      struct {
		PreStop struct {
			Sleep *struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
			Exec *struct {
				Command []string `yaml:"command"`
			} `yaml:"exec"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	SecurityContext struct {
		RunAsNonRoot             *bool `yaml:"runAsNonRoot"`
		ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
	VolumeMounts []k8sMount `yaml:"volumeMounts"`
}

type k8sPort struct {
	Name          string `yaml:"name"`
	ContainerPort int    `yaml:"containerPort"`
}

type k8sMount struct {
	Name      string `yaml:"name"`
	MountPath string `yaml:"mountPath"`
	SubPath   string `yaml:"subPath"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"` // a number or a port name
	} `yaml:"httpGet"`
}

type serviceSpec struct {
	Type     string            `yaml:"type"`
	Selector map[string]string `yaml:"selector"`
	Ports    []struct {
		Name       string `yaml:"name"`
		Port       int    `yaml:"port"`
		TargetPort any    `yaml:"targetPort"`
	} `yaml:"ports"`
}

// port resolves a Kubernetes port reference (number or name) against c's ports; 0 when it
// names no port of c.
func (c *k8sContainer) port(ref any) int {
	switch v := ref.(type) {
	case int:
		return v
	case string:
		for _, p := range c.Ports {
			if p.Name == v {
				return p.ContainerPort
			}
		}
	}
	return 0
}

func (c *k8sContainer) hasPort(n int) bool {
	return slices.ContainsFunc(c.Ports, func(p k8sPort) bool { return p.ContainerPort == n })
}

func k8sObjects(t *testing.T) []k8sObject {
	t.Helper()
	var objs []k8sObject
	for _, f := range yamlFiles(t, filepath.Join(deployDir, "kubernetes")) {
		for _, doc := range yamlDocs(t, f) {
			o := k8sObject{file: f}
			if err := doc.Decode(&o); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			objs = append(objs, o)
		}
	}
	return objs
}

func addrPort(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestDeployKubernetes(t *testing.T) {
	objs := k8sObjects(t)
	byKind := map[string][]k8sObject{}
	for _, o := range objs {
		if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
			t.Errorf("%s: object without apiVersion, kind or metadata.name: %+v", o.file, o)
		}
		byKind[o.Kind] = append(byKind[o.Kind], o)
	}
	for _, kind := range []string{"ConfigMap", "Deployment", "Service"} {
		if len(byKind[kind]) != 1 {
			t.Fatalf("want one %s under deploy/kubernetes, found %d", kind, len(byKind[kind]))
		}
	}
	dep := byKind["Deployment"][0]
	var spec deploymentSpec
	if err := dep.Spec.Decode(&spec); err != nil {
		t.Fatalf("%s: %v", dep.file, err)
	}
	pod := spec.Template.Spec
	if spec.Replicas < 2 {
		t.Errorf("replicas = %d: one pod is no tier", spec.Replicas)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("want one container, found %d", len(pod.Containers))
	}
	c := pod.Containers[0]

	// The config file named on the command line comes from the ConfigMap, mounted whole.
	i := slices.Index(c.Args, "--config")
	if i < 0 || i+1 >= len(c.Args) {
		t.Fatalf("container args %q name no --config file", c.Args)
	}
	cfgPath := c.Args[i+1]
	mountIdx := slices.IndexFunc(c.VolumeMounts, func(m k8sMount) bool {
		return m.MountPath == path.Dir(cfgPath) || m.MountPath == cfgPath
	})
	if mountIdx < 0 {
		t.Fatalf("no volume mounted at %s, the directory of --config %s", path.Dir(cfgPath), cfgPath)
	}
	mount := c.VolumeMounts[mountIdx]
	if mount.SubPath != "" || mount.MountPath != path.Dir(cfgPath) {
		t.Errorf("config mounted as %s (subPath %q): a subPath or single-file mount never sees ConfigMap updates; mount the directory %s", mount.MountPath, mount.SubPath, path.Dir(cfgPath))
	}
	cmName := ""
	for _, v := range pod.Volumes {
		if v.Name == mount.Name && v.ConfigMap != nil {
			cmName = v.ConfigMap.Name
		}
	}
	cm := byKind["ConfigMap"][0]
	if cmName != cm.Metadata.Name {
		t.Fatalf("volume %q mounts ConfigMap %q, want %q", mount.Name, cmName, cm.Metadata.Name)
	}
	data, ok := cm.Data[path.Base(cfgPath)]
	if !ok {
		t.Fatalf("ConfigMap %s has no key %s", cm.Metadata.Name, path.Base(cfgPath))
	}
	cfg, err := config.Parse([]byte(data), cm.file+":"+path.Base(cfgPath))
	if err != nil {
		t.Fatalf("the ConfigMap's config does not load: %v", err)
	}
	if !cfg.WatchConfig {
		t.Error("the ConfigMap's config turns watch_config off: updates would need a restart")
	}
	listenPort, adminPort := addrPort(t, cfg.Listen), addrPort(t, cfg.Admin)
	for _, p := range []int{listenPort, adminPort} {
		if !c.hasPort(p) {
			t.Errorf("container declares no port %d (listen %s, admin %s)", p, cfg.Listen, cfg.Admin)
		}
	}
	for _, addr := range []string{cfg.Listen, cfg.Admin} {
		if host, _, _ := net.SplitHostPort(addr); host != "0.0.0.0" && host != "" && host != "::" {
			t.Errorf("%s listens on %s only: unreachable from outside the pod", addr, host)
		}
	}

	for name, p := range map[string]*k8sProbe{"readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe} {
		switch {
		case p == nil || p.HTTPGet == nil:
			t.Errorf("%s: want an httpGet probe", name)
		case p.HTTPGet.Path != "/healthz":
			t.Errorf("%s: path %q, want /healthz", name, p.HTTPGet.Path)
		case c.port(p.HTTPGet.Port) != adminPort:
			t.Errorf("%s: port %v is not the admin port %d", name, p.HTTPGet.Port, adminPort)
		}
	}

	ann := spec.Template.Metadata.Annotations
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != strconv.Itoa(adminPort) || ann["prometheus.io/path"] != "/metrics" {
		t.Errorf("pod annotations %v: want prometheus.io/scrape \"true\", port %q, path /metrics", ann, strconv.Itoa(adminPort))
	}

	preStop := 0
	switch ps := c.Lifecycle.PreStop; {
	case ps.Sleep != nil:
		preStop = ps.Sleep.Seconds
	case ps.Exec != nil:
		t.Errorf("preStop exec %q: the distroless image has no binary to run; use the sleep action", ps.Exec.Command)
	}
	if preStop <= 0 {
		t.Error("no preStop sleep: the pod would stop accepting before the endpoints drop it")
	}
	grace := time.Duration(pod.TerminationGracePeriodSeconds) * time.Second
	if need := cfg.ShutdownTimeout + time.Duration(preStop)*time.Second; grace <= need {
		t.Errorf("terminationGracePeriodSeconds %v <= preStop %ds + shutdown_timeout %v: the drain would be killed", grace, preStop, cfg.ShutdownTimeout)
	}

	sc := c.SecurityContext
	if !pod.SecurityContext.RunAsNonRoot && (sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot) {
		t.Error("runAsNonRoot is not set")
	}
	if !sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("container securityContext %+v: want readOnlyRootFilesystem, no privilege escalation, drop ALL", sc)
	}

	svc := byKind["Service"][0]
	var ss serviceSpec
	if err := svc.Spec.Decode(&ss); err != nil {
		t.Fatal(err)
	}
	for k, v := range ss.Selector {
		if spec.Template.Metadata.Labels[k] != v {
			t.Errorf("Service selector %s=%s does not match the pod labels %v", k, v, spec.Template.Metadata.Labels)
		}
	}
	targets := map[int]bool{}
	for _, p := range ss.Ports {
		tp := c.port(p.TargetPort)
		if p.TargetPort == nil {
			tp = p.Port
		}
		if !c.hasPort(tp) {
			t.Errorf("Service port %s targets %v, not a container port", p.Name, p.TargetPort)
		}
		targets[tp] = true
	}
	if !targets[listenPort] || !targets[adminPort] {
		t.Errorf("Service targets %v, want the client port %d and the admin port %d", targets, listenPort, adminPort)
	}
}

// dockerInstruction is one Dockerfile instruction with its continuation lines joined.
type dockerInstruction struct {
	cmd  string // upper case
	args string
}

func dockerfile(t *testing.T) []dockerInstruction {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(deployDir, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var out []dockerInstruction
	var cur strings.Builder
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") || (line == "" && cur.Len() == 0) {
			continue
		}
		if rest, ok := strings.CutSuffix(line, "\\"); ok {
			cur.WriteString(rest + " ")
			continue
		}
		cur.WriteString(line)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, dockerInstruction{strings.ToUpper(cmd), strings.Join(strings.Fields(args), " ")})
		cur.Reset()
	}
	return out
}

func TestDeployDockerfile(t *testing.T) {
	var stages []string // stage names, "" when unnamed
	var last struct {
		base, user string
		expose     []string
	}
	var build string
	for _, in := range dockerfile(t) {
		switch in.cmd {
		case "FROM":
			f := strings.Fields(in.args)
			name := ""
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				name = f[2]
			}
			stages = append(stages, name)
			last.base, last.user, last.expose = f[0], "", nil
		case "USER":
			last.user = in.args
		case "EXPOSE":
			last.expose = append(last.expose, strings.Fields(in.args)...)
		case "RUN":
			if strings.Contains(in.args, "go build") {
				build = in.args
			}
		case "COPY":
			f := strings.Fields(in.args)
			if from, ok := strings.CutPrefix(f[0], "--from="); ok {
				if !slices.Contains(stages[:len(stages)-1], from) {
					t.Errorf("COPY --from=%s names no earlier stage (stages %q)", from, stages)
				}
				continue
			}
			for _, src := range f[:len(f)-1] {
				if !strings.HasPrefix(src, "--") && !strings.ContainsAny(src, "*?") {
					if _, err := os.Stat(filepath.Join("..", src)); err != nil {
						t.Errorf("COPY source %s is not in the build context (the repository root): %v", src, err)
					}
				}
			}
		}
	}
	if len(stages) < 2 {
		t.Fatalf("want a multi-stage build, found %d FROM", len(stages))
	}
	user := strings.SplitN(last.user, ":", 2)[0]
	nonrootBase := strings.HasSuffix(last.base, ":nonroot")
	if (user == "" && !nonrootBase) || user == "root" || user == "0" {
		t.Errorf("final stage (FROM %s) runs as %q: want a non-root USER or a :nonroot base", last.base, last.user)
	}
	for _, p := range []string{"11211", "9151"} {
		if !slices.Contains(last.expose, p) && !slices.Contains(last.expose, p+"/tcp") {
			t.Errorf("final stage does not EXPOSE %s (exposes %q)", p, last.expose)
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-s -w", "-X main.version=", "./cmd/moxi"} {
		if !strings.Contains(build, want) {
			t.Errorf("go build step %q lacks %q", build, want)
		}
	}
	// -X of a variable that does not exist is silently ignored, so make sure it exists.
	main, err := os.ReadFile("../cmd/moxi/main.go")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^var version\b`).Match(main) {
		t.Error("cmd/moxi/main.go has no package-level `var version` for -X main.version to set")
	}
}

// systemdUnit reads a unit file as section → key → values (a key may repeat).
func systemdUnit(t *testing.T, file string) map[string]map[string][]string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	unit := map[string]map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			unit[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s: unexpected line %q", file, line)
			}
			unit[section][strings.TrimSpace(k)] = append(unit[section][strings.TrimSpace(k)], strings.TrimSpace(v))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return unit
}

func TestDeploySystemdUnit(t *testing.T) {
	svc := systemdUnit(t, filepath.Join(deployDir, "systemd", "moxi.service"))["Service"]
	one := func(k string) string {
		if v := svc[k]; len(v) > 0 {
			return v[len(v)-1]
		}
		return ""
	}
	if one("Type") != "simple" {
		t.Errorf("Type=%q, want simple: moxi does not fork or notify", one("Type"))
	}
	if !strings.Contains(one("ExecStart"), "--config ") {
		t.Errorf("ExecStart=%q names no --config", one("ExecStart"))
	}
	if !regexp.MustCompile(`kill (-HUP|-s HUP|--signal[= ]HUP|-SIGHUP|-s SIGHUP) \$MAINPID$`).MatchString(one("ExecReload")) {
		t.Errorf("ExecReload=%q does not send SIGHUP to $MAINPID", one("ExecReload"))
	}
	if u := one("User"); (u == "" || u == "root") && one("DynamicUser") != "yes" {
		t.Errorf("runs as root: want User= or DynamicUser=yes")
	}
	for k, want := range map[string]string{"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes", "Restart": "on-failure"} {
		if one(k) != want {
			t.Errorf("%s=%q, want %s", k, one(k), want)
		}
	}
	if n, err := strconv.Atoi(one("LimitNOFILE")); err != nil || n < config.Default().Limits.MaxConnections {
		t.Errorf("LimitNOFILE=%q: want at least max_connections' default %d", one("LimitNOFILE"), config.Default().Limits.MaxConnections)
	}
	stop := one("TimeoutStopSec")
	if _, err := strconv.Atoi(stop); err == nil {
		stop += "s"
	}
	d, err := time.ParseDuration(stop)
	if err != nil || d <= config.Default().ShutdownTimeout {
		t.Errorf("TimeoutStopSec=%q: want more than shutdown_timeout's default %v", one("TimeoutStopSec"), config.Default().ShutdownTimeout)
	}
}

// alertRules reads deploy/prometheus/alerts.yaml.
func alertRules(t *testing.T) []alertRule {
	t.Helper()
	var file struct {
		Groups []struct {
			Name  string      `yaml:"name"`
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	docs := yamlDocs(t, filepath.Join(deployDir, "prometheus", "alerts.yaml"))
	if len(docs) != 1 {
		t.Fatalf("alerts.yaml: want one document, found %d", len(docs))
	}
	if err := docs[0].Decode(&file); err != nil {
		t.Fatal(err)
	}
	var rules []alertRule
	for _, g := range file.Groups {
		rules = append(rules, g.Rules...)
	}
	return rules
}

type alertRule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Annotations map[string]string `yaml:"annotations"`
}

func TestDeployAlerts(t *testing.T) {
	rules := alertRules(t)
	var names []string
	for _, r := range rules {
		names = append(names, r.Alert)
		if r.Alert == "" || strings.TrimSpace(r.Expr) == "" {
			t.Errorf("rule %+v: want alert and expr", r)
		}
		if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
			t.Errorf("%s: want summary and description annotations", r.Alert)
		}
		if r.For != "" {
			if _, err := model.ParseDuration(r.For); err != nil {
				t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
			}
		}
	}
	for _, want := range requiredAlerts {
		if !slices.Contains(names, want) {
			t.Errorf("alert %s missing (have %q)", want, names)
		}
	}
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

func TestDeployDashboard(t *testing.T) {
	d := dashboard(t)
	if v, _ := d["schemaVersion"].(float64); v < 36 {
		t.Errorf("schemaVersion %v: want a current Grafana schema (36 or later)", d["schemaVersion"])
	}
	hasDatasource := false
	tmpl, _ := d["templating"].(map[string]any)
	vars, _ := tmpl["list"].([]any)
	for _, v := range vars {
		m, _ := v.(map[string]any)
		if m["name"] == "datasource" && m["type"] == "datasource" && m["query"] == "prometheus" {
			hasDatasource = true
		}
	}
	if !hasDatasource {
		t.Error("no templating variable datasource of type datasource for prometheus")
	}
	panels, _ := d["panels"].([]any)
	if len(panels) == 0 {
		t.Fatal("no panels")
	}
	for _, p := range panels {
		m, _ := p.(map[string]any)
		switch m["type"] {
		case "timeseries", "stat", "row":
		default:
			t.Errorf("panel %q: type %v, want timeseries or stat", m["title"], m["type"])
		}
		if m["type"] == "row" {
			continue
		}
		ds, _ := m["datasource"].(map[string]any)
		if ds["uid"] != "${datasource}" {
			t.Errorf("panel %q: datasource %v, want uid ${datasource}", m["title"], m["datasource"])
		}
		targets, _ := m["targets"].([]any)
		var exprs []string
		queries(targets, &exprs)
		if len(exprs) == 0 {
			t.Errorf("panel %q has no query", m["title"])
		}
	}
}

var metricName = regexp.MustCompile(`moxi_[a-z_]+`)

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
// a hot-cache key read twice, a fire-and-forget set, a miss, and a reload.
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
	}
	for _, s := range steps {
		lines := roundTrip(t, c, r, s.req, s.last)
		if got := lines[len(lines)-1]; got != s.last {
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

// scrape fetches and parses moxi's /metrics.
func scrape(t *testing.T, admin string) map[string]*dto.MetricFamily {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
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

func TestDeployMetricsExported(t *testing.T) {
	used := deployedMetrics(t)
	if len(used) < 8 {
		t.Fatalf("the dashboard and alerts use only %d moxi metrics: %v", len(used), used)
	}

	mc, oldMC, newMC := memcachedtest.Start(t), memcachedtest.Start(t), memcachedtest.Start(t)
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

	cfg := writeConfig(t, fmt.Sprintf(`pools:
  main:
    timeout: 2s
    migrate_rate: 1
    servers:
      - %q
      - name: migrating
        addr: %q
        migrate_from: %q
hot_cache:
  prefixes: ["hot:"]
fire_and_forget:
  prefixes: ["ff:"]
`, mc.Addr, newMC.Addr, oldMC.Addr))
	admin := freeAddr(t)
	p := startMoxi(t, "--config", cfg, "--admin", admin)
	if err := memcachedtest.WaitListening(admin, 5*time.Second); err != nil {
		t.Fatalf("admin: %v\n%s", err, p.out.String())
	}
	exercise(t, p.addr, admin)
	fams := scrape(t, admin)

	var missing []string
	for _, name := range slices.Sorted(maps.Keys(used)) {
		if !exported(fams, name) {
			missing = append(missing, fmt.Sprintf("%s (used in %s)", name, strings.Join(used[name], ", ")))
		}
	}
	for _, m := range contractMetrics {
		f, ok := fams[m.name]
		if !ok {
			if !slices.ContainsFunc(missing, func(s string) bool { return strings.HasPrefix(s, m.name+" ") }) {
				missing = append(missing, m.name+" (contract)")
			}
			continue
		}
		if f.GetType() != m.typ {
			t.Errorf("%s is a %v, the contract says %v", m.name, f.GetType(), m.typ)
		}
		for _, s := range f.GetMetric() {
			var have []string
			for _, l := range s.GetLabel() {
				have = append(have, l.GetName())
			}
			for _, l := range m.labels {
				if !slices.Contains(have, l) {
					t.Errorf("%s series with labels %q lacks label %q", m.name, have, l)
				}
			}
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		t.Errorf("moxi does not export %d metric families the deployment files or the contract need:\n  %s", len(missing), strings.Join(missing, "\n  "))
	}
}
