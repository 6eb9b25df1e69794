package test

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

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

// contractMetrics is the /metrics row of CONTRACT.md ("Admin HTTP"): each family, its type
// and the labels every one of its series carries. The dashboard and the alerts may query
// these names and no others (beyondContract aside).
var contractMetrics = []exportedMetric{
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
	{"moxi_migration_keys_listed", dto.MetricType_GAUGE, []string{"pool", "server"}},
	{"moxi_migration_phase", dto.MetricType_GAUGE, []string{"pool", "server", "phase"}},
	{"moxi_build_info", dto.MetricType_GAUGE, []string{"version", "goversion"}},
	{"moxi_config_last_reload_successful", dto.MetricType_GAUGE, nil},
	{"moxi_config_last_reload_success_timestamp_seconds", dto.MetricType_GAUGE, nil},
	{"moxi_get_hits_total", dto.MetricType_COUNTER, nil},
	{"moxi_get_misses_total", dto.MetricType_COUNTER, nil},
	{"moxi_error_answers_total", dto.MetricType_COUNTER, []string{"kind"}},
	{"moxi_connections_total", dto.MetricType_COUNTER, []string{"result"}},
	{"moxi_warmup_reads_total", dto.MetricType_COUNTER, []string{"pool", "result"}},
	{"moxi_shadow_requests_total", dto.MetricType_COUNTER, []string{"pool", "result"}},
}

// beyondContract are families moxi exports and README.md documents but the contract does not
// name: the dashboard's backend latency panel needs the first.
var beyondContract = []exportedMetric{
	{"moxi_backend_request_duration_seconds", dto.MetricType_HISTOGRAM, []string{"pool", "server"}},
}

type exportedMetric struct {
	name   string
	typ    dto.MetricType
	labels []string
}

// family finds the family of contractMetrics or beyondContract that a series name a query
// uses belongs to: the family itself, or a histogram's _bucket, _sum or _count.
func family(name string) (exportedMetric, bool) {
	for _, m := range slices.Concat(contractMetrics, beyondContract) {
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

// requiredAlerts are the alerts an operator of moxi can count on finding in alerts.yaml.
var requiredAlerts = []string{
	"MoxiDown", "MoxiBackendDown", "MoxiPoolDown", "MoxiHighErrorRate", "MoxiHighLatency",
	"MoxiMigrationStuck", "MoxiConfigReloadFailing", "MoxiFireAndForgetBacklog",
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
	Namespace   string            `yaml:"namespace"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

type deploymentSpec struct {
	Replicas int `yaml:"replicas"`
	Template struct {
		Metadata k8sMeta `yaml:"metadata"`
		Spec     struct {
			AutomountServiceAccountToken  *bool `yaml:"automountServiceAccountToken"`
			TerminationGracePeriodSeconds int   `yaml:"terminationGracePeriodSeconds"`
			SecurityContext               struct {
				RunAsNonRoot bool `yaml:"runAsNonRoot"`
			} `yaml:"securityContext"`
			Containers []k8sContainer `yaml:"containers"`
			Volumes    []struct {
				Name      string `yaml:"name"`
				ConfigMap *struct {
					Name string `yaml:"name"`
				} `yaml:"configMap"`
				Secret *struct {
					SecretName string `yaml:"secretName"`
					Items      []struct {
						Key  string `yaml:"key"`
						Path string `yaml:"path"`
					} `yaml:"items"`
				} `yaml:"secret"`
			} `yaml:"volumes"`
		} `yaml:"spec"`
	} `yaml:"template"`
}

type k8sContainer struct {
	Name string   `yaml:"name"`
	Args []string `yaml:"args"`
	Env  []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
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
	Resources struct {
		Limits map[string]string `yaml:"limits"`
	} `yaml:"resources"`
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

type networkPolicySpec struct {
	PodSelector struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"podSelector"`
	PolicyTypes []string     `yaml:"policyTypes"`
	Ingress     []policyRule `yaml:"ingress"`
	Egress      []policyRule `yaml:"egress"`
}

// policyRule is an ingress rule (peers in from) or an egress rule (peers in to).
type policyRule struct {
	Ports []struct {
		Port     any    `yaml:"port"` // a number or a port name
		Protocol string `yaml:"protocol"`
	} `yaml:"ports"`
	From []yaml.Node `yaml:"from"`
	To   []yaml.Node `yaml:"to"`
}

type podMonitorSpec struct {
	JobLabel string `yaml:"jobLabel"`
	Selector struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"selector"`
	PodMetricsEndpoints []struct {
		Port string `yaml:"port"`
		Path string `yaml:"path"`
	} `yaml:"podMetricsEndpoints"`
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

func (c *k8sContainer) env(name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// k8sObjects reads every object under deploy/kubernetes, subdirectories included.
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

// k8sDeploy is the shipped Kubernetes deployment: its objects by kind, and the parts of the
// Deployment the tests compare the other files with.
type k8sDeploy struct {
	byKind map[string][]k8sObject
	spec   deploymentSpec
	pod    k8sMeta // the pod template's metadata
	c      k8sContainer
}

func k8sDeployment(t *testing.T) k8sDeploy {
	t.Helper()
	d := k8sDeploy{byKind: map[string][]k8sObject{}}
	for _, o := range k8sObjects(t) {
		if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
			t.Errorf("%s: object without apiVersion, kind or metadata.name: %+v", o.file, o)
		}
		d.byKind[o.Kind] = append(d.byKind[o.Kind], o)
	}
	for _, kind := range []string{"ConfigMap", "Deployment", "Service", "NetworkPolicy", "PodMonitor"} {
		if len(d.byKind[kind]) != 1 {
			t.Fatalf("want one %s under deploy/kubernetes, found %d", kind, len(d.byKind[kind]))
		}
	}
	dep := d.byKind["Deployment"][0]
	if err := dep.Spec.Decode(&d.spec); err != nil {
		t.Fatalf("%s: %v", dep.file, err)
	}
	if len(d.spec.Template.Spec.Containers) != 1 {
		t.Fatalf("want one container, found %d", len(d.spec.Template.Spec.Containers))
	}
	d.pod, d.c = d.spec.Template.Metadata, d.spec.Template.Spec.Containers[0]
	return d
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

// byteSize parses a memory amount: a number of bytes followed by one of units' suffixes, or
// none.
func byteSize(s string, units map[string]int64) (int64, error) {
	num := strings.TrimRightFunc(s, func(r rune) bool { return r < '0' || r > '9' })
	mult := int64(1)
	if suffix := s[len(num):]; suffix != "" {
		m, ok := units[suffix]
		if !ok {
			return 0, fmt.Errorf("%q: unknown unit %q", s, suffix)
		}
		mult = m
	}
	n, err := strconv.ParseInt(num, 10, 64)
	return n * mult, err
}

var (
	k8sUnits = map[string]int64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "k": 1e3, "M": 1e6, "G": 1e9}
	goUnits  = map[string]int64{"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
)

// configKey reads one key of the ConfigMap's moxi.yaml as plain YAML, for keys the config
// package may not know yet.
func configKey(t *testing.T, data, key string) string {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal([]byte(data), &m); err != nil {
		t.Fatal(err)
	}
	s, _ := m[key].(string)
	return s
}

func TestDeployKubernetes(t *testing.T) {
	d := k8sDeployment(t)
	spec, pod, c := d.spec, d.spec.Template.Spec, d.c
	if spec.Replicas < 2 {
		t.Errorf("replicas = %d: one pod is no tier", spec.Replicas)
	}

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
	cm := d.byKind["ConfigMap"][0]
	if cmName != cm.Metadata.Name {
		t.Fatalf("volume %q mounts ConfigMap %q, want %q", mount.Name, cmName, cm.Metadata.Name)
	}
	data, ok := cm.Data[path.Base(cfgPath)]
	if !ok {
		t.Fatalf("ConfigMap %s has no key %s", cm.Metadata.Name, path.Base(cfgPath))
	}

	// The admin token (admin_token_file, CONTRACT.md) is a file of a mounted Secret.
	if tokenFile := configKey(t, data, "admin_token_file"); tokenFile == "" {
		t.Error("the ConfigMap's config sets no admin_token_file: POST /reload and GET /config would be open to the cluster")
	} else {
		secret := ""
		for _, m := range c.VolumeMounts {
			if m.MountPath != path.Dir(tokenFile) || m.SubPath != "" {
				continue
			}
			for _, v := range pod.Volumes {
				if v.Name != m.Name || v.Secret == nil {
					continue
				}
				key := path.Base(tokenFile) // a Secret volume without items has a file per key
				for _, it := range v.Secret.Items {
					if it.Path == path.Base(tokenFile) {
						key = it.Key
					}
				}
				secret = v.Secret.SecretName + "/" + key
			}
		}
		if secret == "" {
			t.Errorf("admin_token_file %s is not a file of a Secret volume mounted at %s", tokenFile, path.Dir(tokenFile))
		}
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

	for _, probe := range []struct {
		name, path string
		p          *k8sProbe
	}{
		{"readinessProbe", "/readyz", c.ReadinessProbe},
		{"livenessProbe", "/healthz", c.LivenessProbe},
	} {
		switch p := probe.p; {
		case p == nil || p.HTTPGet == nil:
			t.Errorf("%s: want an httpGet probe", probe.name)
		case p.HTTPGet.Path != probe.path:
			t.Errorf("%s: path %q, want %s", probe.name, p.HTTPGet.Path, probe.path)
		case c.port(p.HTTPGet.Port) != adminPort:
			t.Errorf("%s: port %v is not the admin port %d", probe.name, p.HTTPGet.Port, adminPort)
		}
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
	if a := pod.AutomountServiceAccountToken; a == nil || *a {
		t.Error("automountServiceAccountToken is not false: moxi needs no Kubernetes API token")
	}

	// GOMEMLIMIT: the GC's target, set under the container's limit with room for what the
	// cgroup charges beside the Go heap.
	limit, err := byteSize(c.Resources.Limits["memory"], k8sUnits)
	if err != nil || limit == 0 {
		t.Fatalf("memory limit %q: %v", c.Resources.Limits["memory"], err)
	}
	if soft, err := byteSize(c.env("GOMEMLIMIT"), goUnits); err != nil || soft >= limit || soft < limit*3/4 {
		t.Errorf("GOMEMLIMIT %q (%v) against the memory limit %s: want 75%% to 99%% of it", c.env("GOMEMLIMIT"), err, c.Resources.Limits["memory"])
	}

	// The Service publishes the client port only: Prometheus scrapes the pods themselves.
	svc := d.byKind["Service"][0]
	var ss serviceSpec
	if err := svc.Spec.Decode(&ss); err != nil {
		t.Fatal(err)
	}
	for k, v := range ss.Selector {
		if d.pod.Labels[k] != v {
			t.Errorf("Service selector %s=%s does not match the pod labels %v", k, v, d.pod.Labels)
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
	if !targets[listenPort] || targets[adminPort] {
		t.Errorf("Service targets %v, want the client port %d and not the admin port %d", targets, listenPort, adminPort)
	}

	testNetworkPolicy(t, d, cfg, listenPort, adminPort)
}

// testNetworkPolicy checks that the NetworkPolicy covers moxi's pods, admits clients to the
// client port and only selected peers to the admin port, and lets moxi reach its memcached
// servers and DNS.
func testNetworkPolicy(t *testing.T, d k8sDeploy, cfg *config.Config, listenPort, adminPort int) {
	np := d.byKind["NetworkPolicy"][0]
	var spec networkPolicySpec
	if err := np.Spec.Decode(&spec); err != nil {
		t.Fatal(err)
	}
	if len(spec.PodSelector.MatchLabels) == 0 {
		t.Error("NetworkPolicy podSelector selects every pod of the namespace")
	}
	for k, v := range spec.PodSelector.MatchLabels {
		if d.pod.Labels[k] != v {
			t.Errorf("NetworkPolicy podSelector %s=%s does not match the pod labels %v", k, v, d.pod.Labels)
		}
	}
	if !slices.Contains(spec.PolicyTypes, "Ingress") || !slices.Contains(spec.PolicyTypes, "Egress") {
		t.Errorf("NetworkPolicy policyTypes %q: want Ingress and Egress", spec.PolicyTypes)
	}
	admitted := map[int]bool{}
	for i, r := range spec.Ingress {
		if len(r.Ports) == 0 {
			t.Errorf("ingress rule %d admits every port", i)
		}
		for _, p := range r.Ports {
			n := d.c.port(p.Port)
			admitted[n] = true
			if n == adminPort && len(r.From) == 0 {
				t.Errorf("ingress rule %d admits anyone to the admin port %d", i, adminPort)
			}
		}
	}
	if want := map[int]bool{listenPort: true, adminPort: true}; !maps.Equal(admitted, want) {
		t.Errorf("NetworkPolicy admits ports %v, want exactly the client port %d and the admin port %d", admitted, listenPort, adminPort)
	}
	egress := map[string]bool{} // "port/protocol"
	for _, r := range spec.Egress {
		for _, p := range r.Ports {
			proto := cmp.Or(p.Protocol, "TCP")
			egress[fmt.Sprint(p.Port)+"/"+proto] = true
		}
	}
	need := []string{"53/UDP", "53/TCP"}
	for _, p := range cfg.Pools {
		for _, s := range p.Servers {
			need = append(need, strconv.Itoa(addrPort(t, s.Addr))+"/TCP")
		}
	}
	for _, n := range need {
		if !egress[n] {
			t.Errorf("NetworkPolicy egress does not allow %s (DNS and the ConfigMap's memcached servers); allows %v", n, slices.Sorted(maps.Keys(egress)))
		}
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

// runbookBase is where every alert's runbook_url points: a section of deploy/README.md.
const runbookBase = "https://github.com/moxi-proxy/moxi/blob/main/deploy/README.md#"

func TestDeployAlerts(t *testing.T) {
	rules := alertRules(t)
	anchors := readmeAnchors(t)
	tested := alertTests(t)
	var names []string
	for _, r := range rules {
		names = append(names, r.Alert)
		if r.Alert == "" || strings.TrimSpace(r.Expr) == "" {
			t.Errorf("rule %+v: want alert and expr", r)
		}
		if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
			t.Errorf("%s: want summary and description annotations", r.Alert)
		}
		if anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], runbookBase); !ok || !anchors[anchor] {
			t.Errorf("%s: runbook_url %q is not %s<a heading of deploy/README.md>", r.Alert, r.Annotations["runbook_url"], runbookBase)
		}
		if r.For != "" {
			if _, err := model.ParseDuration(r.For); err != nil {
				t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
			}
		}
		if !tested[r.Alert] {
			t.Errorf("%s: no case of alerts_test.yaml expects it to fire", r.Alert)
		}
	}
	for _, want := range requiredAlerts {
		if !slices.Contains(names, want) {
			t.Errorf("alert %s missing (have %q)", want, names)
		}
	}
}

// alertTests reports which alerts some case of alerts_test.yaml expects to fire.
func alertTests(t *testing.T) map[string]bool {
	t.Helper()
	var file struct {
		Tests []struct {
			AlertRuleTest []struct {
				AlertName string `yaml:"alertname"`
				ExpAlerts []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	docs := yamlDocs(t, filepath.Join(deployDir, "prometheus", "alerts_test.yaml"))
	if len(docs) != 1 {
		t.Fatalf("alerts_test.yaml: want one document, found %d", len(docs))
	}
	if err := docs[0].Decode(&file); err != nil {
		t.Fatal(err)
	}
	fires := map[string]bool{}
	for _, c := range file.Tests {
		for _, a := range c.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.AlertName] = true
			}
		}
	}
	return fires
}

// readmeAnchors is the set of anchors GitHub gives deploy/README.md's headings: lower case,
// punctuation dropped, spaces as hyphens.
func readmeAnchors(t *testing.T) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(deployDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		title, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " ")
		if !ok || !strings.HasPrefix(line, "#") {
			continue
		}
		anchor := strings.Map(func(r rune) rune {
			switch {
			case r == ' ':
				return '-'
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				return unicode.ToLower(r)
			}
			return -1
		}, strings.TrimSpace(title))
		anchors[anchor] = true
	}
	return anchors
}

// promtool runs the shipped rules through Prometheus' own checker and their unit tests.
func TestDeployAlertsPromtool(t *testing.T) {
	promtool := requireBinary(t, "promtool")
	for _, args := range [][]string{
		{"check", "rules", "alerts.yaml"},
		{"test", "rules", "alerts_test.yaml"},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = filepath.Join(deployDir, "prometheus")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// relabelConfig is one of a scrape config's relabel_configs.
type relabelConfig struct {
	SourceLabels []string `yaml:"source_labels"`
	Separator    *string  `yaml:"separator"`
	Regex        *string  `yaml:"regex"`
	TargetLabel  string   `yaml:"target_label"`
	Replacement  *string  `yaml:"replacement"`
	Action       string   `yaml:"action"`
}

// relabel applies rules to a target's labels as Prometheus does for the actions the shipped
// config uses (replace, keep, drop, labelmap); false when the target is dropped.
func relabel(t *testing.T, labels map[string]string, rules []relabelConfig) bool {
	t.Helper()
	for _, r := range rules {
		sep, regex, repl := ";", "(.*)", "$1"
		if r.Separator != nil {
			sep = *r.Separator
		}
		if r.Regex != nil {
			regex = *r.Regex
		}
		if r.Replacement != nil {
			repl = *r.Replacement
		}
		re := regexp.MustCompile("^(?:" + regex + ")$")
		var vals []string
		for _, l := range r.SourceLabels {
			vals = append(vals, labels[l])
		}
		val := strings.Join(vals, sep)
		switch cmp.Or(r.Action, "replace") {
		case "keep":
			if !re.MatchString(val) {
				return false
			}
		case "drop":
			if re.MatchString(val) {
				return false
			}
		case "replace":
			if m := re.FindStringSubmatchIndex(val); m != nil {
				if v := string(re.ExpandString(nil, repl, val, m)); v != "" {
					labels[r.TargetLabel] = v
				} else {
					delete(labels, r.TargetLabel)
				}
			}
		case "labelmap":
			for name, v := range maps.Clone(labels) {
				if m := re.FindStringSubmatchIndex(name); m != nil {
					labels[string(re.ExpandString(nil, repl, name, m))] = v
				}
			}
		default:
			t.Fatalf("relabel action %q: not simulated by this test", r.Action)
		}
	}
	return true
}

// scrapeTarget is what one shipped scrape makes of moxi's pod: the labels of its series.
type scrapeTarget struct {
	scrape string
	labels map[string]string
}

// The namespace and pod name the simulated scrapes discover moxi's pod under.
const (
	simNamespace = "cache"
	simPod       = "moxi-0"
	simPodIP     = "10.0.0.1"
)

// promScrapeTargets runs deploy/prometheus/prometheus.yml's scrape job over the shipped
// Deployment's pod, one candidate target per container port as Kubernetes pod discovery
// makes them, and returns what remains after relabelling.
func promScrapeTargets(t *testing.T, d k8sDeploy) []scrapeTarget {
	t.Helper()
	var file struct {
		ScrapeConfigs []struct {
			JobName             string `yaml:"job_name"`
			MetricsPath         string `yaml:"metrics_path"`
			KubernetesSDConfigs []struct {
				Role string `yaml:"role"`
			} `yaml:"kubernetes_sd_configs"`
			RelabelConfigs []relabelConfig `yaml:"relabel_configs"`
		} `yaml:"scrape_configs"`
	}
	docs := yamlDocs(t, filepath.Join(deployDir, "prometheus", "prometheus.yml"))
	if len(docs) != 1 {
		t.Fatalf("prometheus.yml: want one document, found %d", len(docs))
	}
	if err := docs[0].Decode(&file); err != nil {
		t.Fatal(err)
	}
	if len(file.ScrapeConfigs) != 1 {
		t.Fatalf("prometheus.yml: want moxi's scrape job alone, found %d", len(file.ScrapeConfigs))
	}
	sc := file.ScrapeConfigs[0]
	if len(sc.KubernetesSDConfigs) != 1 || sc.KubernetesSDConfigs[0].Role != "pod" {
		t.Fatalf("prometheus.yml: job %s: want one kubernetes_sd_config of role pod", sc.JobName)
	}
	sanitize := regexp.MustCompile(`[^a-zA-Z0-9_]`)
	var out []scrapeTarget
	for _, p := range d.c.Ports {
		labels := map[string]string{
			"job":                                         sc.JobName,
			"__address__":                                 net.JoinHostPort(simPodIP, strconv.Itoa(p.ContainerPort)),
			"__metrics_path__":                            cmp.Or(sc.MetricsPath, "/metrics"),
			"__meta_kubernetes_namespace":                 simNamespace,
			"__meta_kubernetes_pod_name":                  simPod,
			"__meta_kubernetes_pod_ip":                    simPodIP,
			"__meta_kubernetes_pod_container_name":        d.c.Name,
			"__meta_kubernetes_pod_container_port_name":   p.Name,
			"__meta_kubernetes_pod_container_port_number": strconv.Itoa(p.ContainerPort),
		}
		for k, v := range d.pod.Labels {
			labels["__meta_kubernetes_pod_label_"+sanitize.ReplaceAllString(k, "_")] = v
			labels["__meta_kubernetes_pod_labelpresent_"+sanitize.ReplaceAllString(k, "_")] = "true"
		}
		for k, v := range d.pod.Annotations {
			labels["__meta_kubernetes_pod_annotation_"+sanitize.ReplaceAllString(k, "_")] = v
		}
		if !relabel(t, labels, sc.RelabelConfigs) {
			continue
		}
		if labels["__metrics_path__"] != "/metrics" {
			t.Errorf("prometheus.yml scrapes %s, not /metrics", labels["__metrics_path__"])
		}
		if _, ok := labels["instance"]; !ok {
			labels["instance"] = labels["__address__"]
		}
		for k := range labels {
			if strings.HasPrefix(k, "__") {
				delete(labels, k)
			}
		}
		out = append(out, scrapeTarget{"prometheus.yml port " + p.Name, labels})
	}
	return out
}

// podMonitorTargets is what prometheus-operator makes of the PodMonitor for moxi's pod.
func podMonitorTargets(t *testing.T, d k8sDeploy) []scrapeTarget {
	t.Helper()
	pm := d.byKind["PodMonitor"][0]
	var spec podMonitorSpec
	if err := pm.Spec.Decode(&spec); err != nil {
		t.Fatal(err)
	}
	for k, v := range spec.Selector.MatchLabels {
		if d.pod.Labels[k] != v {
			return nil // selects no moxi pod
		}
	}
	// The operator's job label: the pod's jobLabel label, else "<namespace>/<name>".
	job := cmp.Or(pm.Metadata.Namespace, simNamespace) + "/" + pm.Metadata.Name
	if spec.JobLabel != "" {
		job = d.pod.Labels[spec.JobLabel]
	}
	var out []scrapeTarget
	for _, ep := range spec.PodMetricsEndpoints {
		n := d.c.port(ep.Port)
		if n == 0 {
			t.Errorf("PodMonitor endpoint port %q names no container port", ep.Port)
			continue
		}
		if p := cmp.Or(ep.Path, "/metrics"); p != "/metrics" {
			t.Errorf("PodMonitor scrapes %s, not /metrics", p)
		}
		out = append(out, scrapeTarget{"PodMonitor port " + ep.Port, map[string]string{
			"job": job, "instance": net.JoinHostPort(simPodIP, strconv.Itoa(n)),
			"namespace": simNamespace, "pod": simPod, "container": d.c.Name, "endpoint": ep.Port,
		}})
	}
	return out
}

var (
	jobMatcher  = regexp.MustCompile(`\bjob\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	labelLists  = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	labelsInTpl = regexp.MustCompile(`\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)`)
	upSelector  = regexp.MustCompile(`\bup\b\s*(\{[^}]*\})?`)
)

// Each shipped scrape (prometheus.yml's job, the PodMonitor) must make exactly one target of
// a moxi pod, on the admin port, and the alerts may select and group by only the labels that
// both give it and the labels of moxi's metrics.
func TestDeployScrapeLabels(t *testing.T) {
	d := k8sDeployment(t)
	adminPort := d.c.port("admin")
	if adminPort == 0 {
		t.Fatal("the container has no port named admin")
	}
	common := map[string]bool{} // labels every scrape gives the target
	for i, targets := range [][]scrapeTarget{promScrapeTargets(t, d), podMonitorTargets(t, d)} {
		if len(targets) != 1 {
			t.Fatalf("scrape %d makes %d targets of a moxi pod, want 1: %v", i, len(targets), targets)
		}
		tg := targets[0]
		if !strings.HasSuffix(tg.labels["instance"], ":"+strconv.Itoa(adminPort)) {
			t.Errorf("%s: target %v is not the admin port %d", tg.scrape, tg.labels, adminPort)
		}
		if i == 0 {
			for k := range tg.labels {
				common[k] = true
			}
		}
		for k := range common {
			if _, ok := tg.labels[k]; !ok {
				delete(common, k)
			}
		}
		for _, r := range alertRules(t) {
			for _, m := range jobMatcher.FindAllStringSubmatch(r.Expr, -1) {
				op, want := m[1], m[2]
				ok := (op == "=" && want == tg.labels["job"]) ||
					(op == "=~" && regexp.MustCompile("^(?:"+want+")$").MatchString(tg.labels["job"]))
				if !ok {
					t.Errorf("alert %s selects job%s%q, but %s gives moxi's target job=%q", r.Alert, op, want, tg.scrape, tg.labels["job"])
				}
			}
		}
	}

	// up exists for every target of every job: an alert on it must name moxi's job.
	allowed := maps.Clone(common)
	allowed["le"] = true
	for _, m := range slices.Concat(contractMetrics, beyondContract) {
		for _, l := range m.labels {
			allowed[l] = true
		}
	}
	for _, r := range alertRules(t) {
		for _, sel := range upSelector.FindAllStringSubmatch(r.Expr, -1) {
			if !jobMatcher.MatchString(sel[1]) {
				t.Errorf("alert %s: %q selects the up series of every job", r.Alert, sel[0])
			}
		}
		var used []string
		for _, m := range labelLists.FindAllStringSubmatch(r.Expr, -1) {
			for _, l := range strings.Split(m[1], ",") {
				used = append(used, strings.TrimSpace(l))
			}
		}
		for _, a := range r.Annotations {
			for _, m := range labelsInTpl.FindAllStringSubmatch(a, -1) {
				used = append(used, m[1])
			}
		}
		for _, l := range used {
			if l != "" && !allowed[l] {
				t.Errorf("alert %s uses label %q, which neither moxi's metrics nor every shipped scrape give (scrape labels: %v)", r.Alert, l, slices.Sorted(maps.Keys(common)))
			}
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
	for _, name := range []string{"job", "namespace", "instance", "pool"} {
		if !slices.ContainsFunc(vars, func(v any) bool {
			m, _ := v.(map[string]any)
			return m["name"] == name && m["type"] == "query"
		}) {
			t.Errorf("no query variable %s", name)
		}
	}
	panels, _ := d["panels"].([]any)
	if len(panels) == 0 {
		t.Fatal("no panels")
	}
	var all []string // every panel query
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
		for _, e := range exprs {
			checkPanelSelectors(t, fmt.Sprint(m["title"]), e)
			all = append(all, e)
		}
	}
	// The charts an operator asks for first: backend latency and the hit ratio.
	joined := strings.Join(all, "\n")
	for what, names := range map[string][]string{
		"backend latency": {"moxi_backend_request_duration_seconds_bucket"},
		"get hit ratio":   {"moxi_get_hits_total", "moxi_get_misses_total"},
	} {
		for _, n := range names {
			if !strings.Contains(joined, n) {
				t.Errorf("no panel charts the %s: no query uses %s", what, n)
			}
		}
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

// Every moxi metric the dashboard and the alerts query is one the contract names (or one of
// beyondContract); TestDeployMetricsExported then checks a running moxi exports them.
func TestDeployMetricNames(t *testing.T) {
	for name, files := range deployedMetrics(t) {
		if _, ok := family(name); !ok {
			t.Errorf("%s (used in %s) is not a metric of CONTRACT.md's /metrics row", name, strings.Join(files, ", "))
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
// only server is down (an error answer), and a reload.
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
  down:
    timeout: 250ms
    failover: false
    servers: [%q]
default_pool: main
routes:
  - prefix: "down:"
    pool: down
hot_cache:
  prefixes: ["hot:"]
fire_and_forget:
  prefixes: ["ff:"]
`, mc.Addr, newMC.Addr, oldMC.Addr, freeAddr(t)))
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
	for _, m := range slices.Concat(contractMetrics, beyondContract) {
		f, ok := fams[m.name]
		if !ok {
			// A family with labels has no series until its first observation (no warm_from
			// or shadow pool here); one without labels always has its one series.
			if len(m.labels) == 0 && !slices.ContainsFunc(missing, func(s string) bool { return strings.HasPrefix(s, m.name+" ") }) {
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
