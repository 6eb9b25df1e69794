package test

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/moxi-proxy/moxi/internal/config"
)

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
	Selector struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"selector"`
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
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Env   []struct {
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
	TCPSocket *struct {
		Port any `yaml:"port"`
	} `yaml:"tcpSocket"`
}

type serviceSpec struct {
	Type      string            `yaml:"type"`
	ClusterIP string            `yaml:"clusterIP"`
	Selector  map[string]string `yaml:"selector"`
	Ports     []struct {
		Name       string `yaml:"name"`
		Port       int    `yaml:"port"`
		TargetPort any    `yaml:"targetPort"`
		Protocol   string `yaml:"protocol"`
	} `yaml:"ports"`
}

type statefulSetSpec struct {
	ServiceName string `yaml:"serviceName"`
	Selector    struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"selector"`
	Template struct {
		Metadata k8sMeta `yaml:"metadata"`
		Spec     struct {
			TerminationGracePeriodSeconds int            `yaml:"terminationGracePeriodSeconds"`
			Containers                    []k8sContainer `yaml:"containers"`
		} `yaml:"spec"`
	} `yaml:"template"`
}

type pdbSpec struct {
	MinAvailable int `yaml:"minAvailable"`
	Selector     struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"selector"`
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
	Ports []policyPort `yaml:"ports"`
	From  []yaml.Node  `yaml:"from"`
	To    []yaml.Node  `yaml:"to"`
}

type policyPort struct {
	Port     any    `yaml:"port"` // a number or a port name; none: every port
	Protocol string `yaml:"protocol"`
}

// policyPeer is one entry of a rule's from or to.
type policyPeer struct {
	NamespaceSelector *struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"namespaceSelector"`
	PodSelector *struct {
		MatchLabels map[string]string `yaml:"matchLabels"`
	} `yaml:"podSelector"`
	IPBlock any `yaml:"ipBlock"`
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

// moxiImage is the image deploy/Dockerfile builds, as the manifests name it; its tags are
// the releases of ../VERSION.
const moxiImage = "ghcr.io/moxi-proxy/moxi"

// releaseVersion is the release number in the repository's VERSION file.
func releaseVersion(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	v := strings.TrimSpace(string(data))
	if v == "" {
		t.Fatal("../VERSION is empty")
	}
	return v
}

// k8sInstalls are the kustomizations under deploy/kubernetes that an operator applies, with
// the kinds of moxi's objects each renders, one object of each, and the other objects it
// renders beside them.
var k8sInstalls = []k8sInstall{
	{"base", []string{"ConfigMap", "Deployment", "NetworkPolicy", "PodDisruptionBudget", "Service"}, nil},
	{"overlays/example", []string{"ConfigMap", "Deployment", "NetworkPolicy", "PodDisruptionBudget", "PodMonitor", "Service"}, nil},
	{"examples/memcached-statefulset", []string{"ConfigMap", "Deployment", "NetworkPolicy", "PodDisruptionBudget", "Service"}, []string{"Service/memcached", "StatefulSet/memcached"}},
}

type k8sInstall struct {
	dir    string   // under deploy/kubernetes
	kinds  []string // of moxi's objects: those labelled app.kubernetes.io/name=moxi
	others []string // "Kind/name" of the other objects, sorted
}

// moxiLabel marks moxi's own objects; an install may render others (a memcached StatefulSet).
const moxiLabel = "app.kubernetes.io/name"

// exampleOverlay is the install with every optional part, the PodMonitor among them.
var exampleOverlay = k8sInstalls[1]

// statefulSetExample is the install whose moxi finds a memcached StatefulSet through DNS.
var statefulSetExample = k8sInstalls[2]

// kustomizeBin finds the kustomize scripts/install-deps.sh installs: on PATH, else in the
// directory `go install` writes to, which is often not on PATH. A missing one fails the
// test; `make test` installs it first.
func kustomizeBin(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("kustomize"); err == nil {
		return p
	}
	out, err := exec.Command("go", "env", "GOBIN", "GOPATH").Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	lines := strings.Split(string(out), "\n") // GOBIN's line is empty when it is unset
	dir := lines[0]
	if dir == "" && len(lines) > 1 {
		gopath, _, _ := strings.Cut(lines[1], string(os.PathListSeparator))
		dir = filepath.Join(gopath, "bin")
	}
	bin := filepath.Join(dir, "kustomize")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("kustomize is neither on PATH nor in %s: run `make deps` (scripts/install-deps.sh, which `make test` runs)", dir)
	}
	return bin
}

// kustomizeBuild renders deploy/kubernetes/<dir> with the real kustomize, as
// `kubectl apply -k` would, and decodes the objects it prints.
func kustomizeBuild(t *testing.T, dir string) []k8sObject {
	t.Helper()
	cmd := exec.Command(kustomizeBin(t), "build", filepath.Join(deployDir, "kubernetes", dir))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kustomize build %s: %v\n%s", dir, err, stderr.Bytes())
	}
	var objs []k8sObject
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		o := k8sObject{file: "kustomize build deploy/kubernetes/" + dir}
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("%s: %v", o.file, err)
		}
		objs = append(objs, o)
	}
}

// k8sDeploy is one rendered install: its objects, moxi's by kind and the others by
// "Kind/name", and the parts of the Deployment the tests compare the other objects with.
type k8sDeploy struct {
	objs   []k8sObject
	byKind map[string][]k8sObject // moxi's objects
	others map[string]k8sObject   // the rest, by "Kind/name"
	spec   deploymentSpec
	pod    k8sMeta // the pod template's metadata
	c      k8sContainer
}

func k8sDeployment(t *testing.T, in k8sInstall) k8sDeploy {
	t.Helper()
	d := k8sDeploy{objs: kustomizeBuild(t, in.dir), byKind: map[string][]k8sObject{}, others: map[string]k8sObject{}}
	for _, o := range d.objs {
		if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
			t.Errorf("%s: object without apiVersion, kind or metadata.name: %+v", o.file, o)
		}
		if o.Metadata.Labels[moxiLabel] == "moxi" {
			d.byKind[o.Kind] = append(d.byKind[o.Kind], o)
		} else {
			d.others[o.Kind+"/"+o.Metadata.Name] = o
		}
	}
	if kinds := slices.Sorted(maps.Keys(d.byKind)); !slices.Equal(kinds, in.kinds) {
		t.Errorf("%s renders moxi's kinds %q, want %q", in.dir, kinds, in.kinds)
	}
	if others := slices.Sorted(maps.Keys(d.others)); !slices.Equal(others, in.others) {
		t.Errorf("%s renders %q beside moxi's objects, want %q", in.dir, others, in.others)
	}
	for _, kind := range in.kinds {
		if len(d.byKind[kind]) != 1 {
			t.Fatalf("want one %s in %s, found %d", kind, in.dir, len(d.byKind[kind]))
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

// Each shipped install, rendered by kustomize as `kubectl apply -k` would send it, runs the
// image of this release with a config moxi loads, and its probes, ports, Secret, memory,
// Service, PodDisruptionBudget and NetworkPolicy agree with that config.
func TestDeployKubernetes(t *testing.T) {
	release := releaseVersion(t)
	for _, in := range k8sInstalls {
		t.Run(in.dir, func(t *testing.T) {
			testKubernetes(t, k8sDeployment(t, in), release)
		})
	}
}

func testKubernetes(t *testing.T, d k8sDeploy, release string) {
	spec, pod, c := d.spec, d.spec.Template.Spec, d.c
	if spec.Replicas < 2 {
		t.Errorf("replicas = %d: one pod is no tier", spec.Replicas)
	}
	if want := moxiImage + ":" + release; c.Image != want {
		t.Errorf("image %q, want %q: the tag is the release in ../VERSION", c.Image, want)
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

	// The admin token (admin_token_file) is a file of a mounted Secret.
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

	// Node drains keep minAvailable pods and must still be able to evict one.
	var ps pdbSpec
	if err := d.byKind["PodDisruptionBudget"][0].Spec.Decode(&ps); err != nil {
		t.Fatal(err)
	}
	for k, v := range ps.Selector.MatchLabels {
		if d.pod.Labels[k] != v {
			t.Errorf("PodDisruptionBudget selector %s=%s does not match the pod labels %v", k, v, d.pod.Labels)
		}
	}
	if ps.MinAvailable < 1 || ps.MinAvailable >= spec.Replicas {
		t.Errorf("PodDisruptionBudget minAvailable %d with %d replicas: want at least 1 and fewer than the replicas, or no drain could evict a pod", ps.MinAvailable, spec.Replicas)
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
		if dc := p.Discover; dc != nil && !dc.SRV { // SRV records bring their ports: TestDeployMemcachedStatefulSet
			need = append(need, strconv.Itoa(dc.Port)+"/TCP")
		}
	}
	for _, n := range need {
		if !egress[n] {
			t.Errorf("NetworkPolicy egress does not allow %s (DNS and the ConfigMap's memcached servers); allows %v", n, slices.Sorted(maps.Keys(egress)))
		}
	}
}

// exampleKustomization is the part of overlays/example/kustomization.yaml the test checks
// against the rendering: kustomize silently skips an images, replicas or labels entry that
// matches nothing.
type exampleKustomization struct {
	Namespace string `yaml:"namespace"`
	Images    []struct {
		Name    string `yaml:"name"`
		NewName string `yaml:"newName"`
		NewTag  string `yaml:"newTag"`
	} `yaml:"images"`
	Replicas []struct {
		Name  string `yaml:"name"`
		Count int    `yaml:"count"`
	} `yaml:"replicas"`
	Labels []struct {
		Pairs            map[string]string `yaml:"pairs"`
		IncludeSelectors bool              `yaml:"includeSelectors"`
		IncludeTemplates bool              `yaml:"includeTemplates"`
	} `yaml:"labels"`
	ConfigMapGenerator []struct {
		Name  string   `yaml:"name"`
		Files []string `yaml:"files"`
	} `yaml:"configMapGenerator"`
}

// What the example overlay says an install changes is what kustomize renders: its
// namespace on every object (the base has none, so `kubectl apply -k base -n NS` works),
// its image and replicas on the Deployment, its labels on every object and pod but on no
// selector, and its own moxi.yaml in the ConfigMap.
func TestDeployKustomizeOverlay(t *testing.T) {
	dir := filepath.Join(deployDir, "kubernetes", exampleOverlay.dir)
	docs := yamlDocs(t, filepath.Join(dir, "kustomization.yaml"))
	if len(docs) != 1 {
		t.Fatalf("%s/kustomization.yaml: want one document, found %d", dir, len(docs))
	}
	var k exampleKustomization
	if err := docs[0].Decode(&k); err != nil {
		t.Fatal(err)
	}
	base, d := k8sDeployment(t, k8sInstalls[0]), k8sDeployment(t, exampleOverlay)

	if k.Namespace == "" {
		t.Error("the example overlay sets no namespace")
	}
	for _, o := range base.objs {
		if o.Metadata.Namespace != "" {
			t.Errorf("base: %s %s has namespace %q: the overlay or kubectl -n chooses it", o.Kind, o.Metadata.Name, o.Metadata.Namespace)
		}
	}
	for _, o := range d.objs {
		if o.Metadata.Namespace != k.Namespace {
			t.Errorf("%s %s is in namespace %q, the overlay's is %q", o.Kind, o.Metadata.Name, o.Metadata.Namespace, k.Namespace)
		}
	}

	baseImage, _, _ := strings.Cut(base.c.Image, ":")
	if len(k.Images) != 1 || k.Images[0].Name != baseImage {
		t.Errorf("the overlay's images %+v: want one entry for the base's image %s", k.Images, baseImage)
	} else if img := k.Images[0]; d.c.Image != cmp.Or(img.NewName, img.Name)+":"+img.NewTag {
		t.Errorf("rendered image %q, the overlay asks for %+v", d.c.Image, img)
	}

	if len(k.Replicas) != 1 || k.Replicas[0].Name != "moxi" || d.spec.Replicas != k.Replicas[0].Count {
		t.Errorf("the overlay's replicas %+v: the Deployment moxi renders with %d", k.Replicas, d.spec.Replicas)
	}

	if len(k.Labels) == 0 {
		t.Error("the example overlay adds no labels")
	}
	for _, l := range k.Labels {
		if l.IncludeSelectors {
			t.Errorf("labels %v includeSelectors: a Deployment's selector cannot change once created", l.Pairs)
		}
		for name, v := range l.Pairs {
			for _, o := range d.objs {
				if o.Metadata.Labels[name] != v {
					t.Errorf("%s %s lacks the overlay's label %s=%s", o.Kind, o.Metadata.Name, name, v)
				}
			}
			if l.IncludeTemplates && d.pod.Labels[name] != v {
				t.Errorf("the pod template lacks the overlay's label %s=%s", name, v)
			}
			if _, ok := d.spec.Selector.MatchLabels[name]; ok {
				t.Errorf("the Deployment's selector has the overlay's label %s", name)
			}
		}
	}

	if len(k.ConfigMapGenerator) == 0 {
		t.Error("the example overlay brings no moxi.yaml of its own")
	}
	for _, g := range k.ConfigMapGenerator {
		cm := d.byKind["ConfigMap"][0]
		if cm.Metadata.Name != g.Name {
			t.Errorf("the overlay generates ConfigMap %s, the rendering has %s", g.Name, cm.Metadata.Name)
		}
		for _, f := range g.Files {
			want, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				t.Fatal(err)
			}
			if cm.Data[path.Base(f)] != string(want) {
				t.Errorf("ConfigMap %s key %s is not the overlay's %s", cm.Metadata.Name, path.Base(f), f)
			}
		}
	}
}

// Every object written under deploy/kubernetes is in what some install renders: a manifest
// no kustomization lists would never be applied.
func TestDeployKustomizeManifests(t *testing.T) {
	rendered := map[string]bool{} // "kind/name"
	dirs := []string{perHostExample}
	for _, in := range k8sInstalls {
		dirs = append(dirs, in.dir)
	}
	for _, dir := range dirs {
		for _, o := range kustomizeBuild(t, dir) {
			rendered[o.Kind+"/"+o.Metadata.Name] = true
		}
	}
	for _, f := range yamlFiles(t, filepath.Join(deployDir, "kubernetes")) {
		for _, doc := range yamlDocs(t, f) {
			var o k8sObject
			if err := doc.Decode(&o); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if o.APIVersion == "" || o.Kind == "Kustomization" || o.Kind == "Component" {
				continue // moxi.yaml, or a kustomization itself
			}
			if !rendered[o.Kind+"/"+o.Metadata.Name] {
				t.Errorf("%s: %s %s is in no install's rendering (%v)", f, o.Kind, o.Metadata.Name, slices.Sorted(maps.Keys(rendered)))
			}
		}
	}
}

// clusterDNSCache is how long the cluster's DNS may keep answering with a pod that is gone:
// CoreDNS's default cache.
const clusterDNSCache = 30 * time.Second

// The memcached-statefulset example holds together: moxi's pool follows the SRV name that
// the headless Service really gives (_<port name>._<protocol>.<service>.<namespace>.svc.
// cluster.local, namespace as rendered), whose targets are the pods' stable DNS names (the
// StatefulSet's serviceName is that Service), so a pod back at a new IP keeps its keys' place;
// the pool is ketama, so scaling moves only the keys of the pod added or removed; a deleted
// pod keeps serving (preStop) until moxi has removed it and copied its keys; and moxi's
// NetworkPolicy lets it reach the pods. TestDeployKubernetes checks the moxi side of it.
func TestDeployMemcachedStatefulSet(t *testing.T) {
	d := k8sDeployment(t, statefulSetExample)
	dir := filepath.Join(deployDir, "kubernetes", statefulSetExample.dir)
	svcObj, okSvc := d.others["Service/memcached"]
	stsObj, okSts := d.others["StatefulSet/memcached"]
	if !okSvc || !okSts {
		t.Fatalf("%s renders no Service or no StatefulSet named memcached", statefulSetExample.dir)
	}
	ns := svcObj.Metadata.Namespace
	if ns == "" {
		t.Fatal("the memcached Service has no namespace: the SRV name depends on it")
	}
	for _, o := range d.objs {
		if o.Metadata.Namespace != ns {
			t.Errorf("%s %s is in namespace %q, the memcached Service in %q", o.Kind, o.Metadata.Name, o.Metadata.Namespace, ns)
		}
	}

	var sts statefulSetSpec
	if err := stsObj.Spec.Decode(&sts); err != nil {
		t.Fatal(err)
	}
	podLabels := sts.Template.Metadata.Labels
	for k, v := range sts.Selector.MatchLabels {
		if podLabels[k] != v {
			t.Errorf("StatefulSet selector %s=%s does not match its pod labels %v", k, v, podLabels)
		}
	}
	if sts.ServiceName != svcObj.Metadata.Name {
		t.Errorf("StatefulSet serviceName %q, want the headless Service %q: without it the SRV targets are named after the pods' IPs, and a restarted pod moves keys", sts.ServiceName, svcObj.Metadata.Name)
	}
	if len(sts.Template.Spec.Containers) != 1 {
		t.Fatalf("want one memcached container, found %d", len(sts.Template.Spec.Containers))
	}
	mc := sts.Template.Spec.Containers[0]
	if !strings.HasPrefix(mc.Image, "memcached:1.6") {
		t.Errorf("image %q: want memcached:1.6, whose lru_crawler metadump and meta get moxi's copy uses", mc.Image)
	}
	itemMiB := 0
	if i := slices.Index(mc.Args, "-m"); i >= 0 && i+1 < len(mc.Args) {
		itemMiB, _ = strconv.Atoi(mc.Args[i+1])
	}
	limit, err := byteSize(mc.Resources.Limits["memory"], k8sUnits)
	switch {
	case itemMiB <= 0:
		t.Errorf("memcached args %q: want -m MiB of item memory", mc.Args)
	case err != nil || limit <= int64(itemMiB)<<20:
		t.Errorf("memory limit %q (%v) against -m %d: memcached needs more than its item memory", mc.Resources.Limits["memory"], err, itemMiB)
	}
	if !slices.Contains(mc.Args, "-c") {
		t.Errorf("memcached args %q: want -c, the connections moxi's pods and copies open", mc.Args)
	}

	// The headless Service: its named port gives the SRV name, and the records' port is the
	// pods' port (the endpoints' port, which a headless Service does not translate).
	var svc serviceSpec
	if err := svcObj.Spec.Decode(&svc); err != nil {
		t.Fatal(err)
	}
	if svc.ClusterIP != "None" {
		t.Errorf("Service %s clusterIP %q, want None: a balancing ClusterIP would spread one key over every pod, and has no per-pod records", svcObj.Metadata.Name, svc.ClusterIP)
	}
	for k, v := range svc.Selector {
		if podLabels[k] != v {
			t.Errorf("Service %s selector %s=%s does not match the memcached pod labels %v", svcObj.Metadata.Name, k, v, podLabels)
		}
	}
	var srvName string
	mcPort := 0
	for _, p := range svc.Ports {
		if p.Name != "memcache" {
			continue
		}
		proto := cmp.Or(p.Protocol, "TCP")
		srvName = fmt.Sprintf("_%s._%s.%s.%s.svc.cluster.local", p.Name, strings.ToLower(proto), svcObj.Metadata.Name, ns)
		mcPort = mc.port(p.TargetPort)
		if p.TargetPort == nil {
			mcPort = p.Port
		}
		if proto != "TCP" || mcPort == 0 || !mc.hasPort(mcPort) {
			t.Errorf("Service port memcache (%s, targetPort %v): want TCP to a memcached container port", proto, p.TargetPort)
		}
	}
	if srvName == "" {
		t.Fatalf("Service %s has no port named memcache: no _memcache._tcp SRV record", svcObj.Metadata.Name)
	}
	if p := mc.ReadinessProbe; p == nil || p.TCPSocket == nil || mc.port(p.TCPSocket.Port) != mcPort {
		t.Errorf("memcached readinessProbe %+v: want a tcpSocket probe of port %d, so that a pod is in the answers only once it accepts", p, mcPort)
	}

	// moxi's config is the example's own moxi.yaml, and its pool follows that SRV name.
	want, err := os.ReadFile(filepath.Join(dir, "moxi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cm := d.byKind["ConfigMap"][0]
	if cm.Data["moxi.yaml"] != string(want) {
		t.Fatalf("ConfigMap %s key moxi.yaml is not %s/moxi.yaml: the generator did not replace the base's", cm.Metadata.Name, dir)
	}
	cfg, err := config.Parse(want, cm.file+":moxi.yaml")
	if err != nil {
		t.Fatalf("the ConfigMap's config does not load: %v", err)
	}
	var pc *config.Pool
	for _, p := range cfg.Pools {
		if p.Discover != nil {
			if pc != nil {
				t.Errorf("pools %s and %s both discover: want one, the StatefulSet's", pc.Name, p.Name)
			}
			pc = p
		}
	}
	if pc == nil {
		t.Fatal("no pool of the ConfigMap's config has discover")
	}
	dc := pc.Discover
	if !dc.SRV || strings.TrimSuffix(dc.DNS, ".") != srvName {
		t.Errorf("pool %s discovers {dns: %s, srv: %v}, want the Service's SRV records {dns: %s, srv: true}", pc.Name, dc.DNS, dc.SRV, srvName)
	}
	if pc.Distribution != "ketama" {
		t.Errorf("pool %s distribution %s: want ketama, with which a change moves only the keys of the pod added or removed", pc.Name, pc.Distribution)
	}
	if cfg.DefaultPool != pc.Name {
		t.Errorf("default_pool %s, want the StatefulSet's pool %s", cfg.DefaultPool, pc.Name)
	}

	// A deleted pod leaves the answers at once; moxi removes it one interval plus
	// remove_after after the DNS cache lets go of it, and reads its keys from it until the
	// copy is done. The preStop sleep keeps memcached running that long, with time left.
	var sleep time.Duration
	if s := mc.Lifecycle.PreStop.Sleep; s != nil {
		sleep = time.Duration(s.Seconds) * time.Second
	}
	if need := clusterDNSCache + dc.Interval + dc.RemoveAfter; sleep <= need {
		t.Errorf("memcached preStop sleep %v <= DNS cache %v + interval %v + remove_after %v: a removed pod would stop before moxi copied its keys", sleep, clusterDNSCache, dc.Interval, dc.RemoveAfter)
	}
	if grace := time.Duration(sts.Template.Spec.TerminationGracePeriodSeconds) * time.Second; grace <= sleep {
		t.Errorf("memcached terminationGracePeriodSeconds %v <= preStop sleep %v: the sleep would be cut short", grace, sleep)
	}

	// moxi's NetworkPolicy lets it reach the memcached pods at the SRV records' port.
	np := d.byKind["NetworkPolicy"][0]
	var nps networkPolicySpec
	if err := np.Spec.Decode(&nps); err != nil {
		t.Fatal(err)
	}
	reaches := slices.ContainsFunc(nps.Egress, func(r policyRule) bool {
		portOK := len(r.Ports) == 0 || slices.ContainsFunc(r.Ports, func(p policyPort) bool {
			return cmp.Or(p.Protocol, "TCP") == "TCP" && (p.Port == nil || mc.port(p.Port) == mcPort)
		})
		return portOK && (len(r.To) == 0 || slices.ContainsFunc(r.To, func(n yaml.Node) bool {
			var peer policyPeer
			if err := n.Decode(&peer); err != nil {
				t.Fatal(err)
			}
			return peerAdmits(peer, np.Metadata.Namespace, ns, podLabels)
		}))
	})
	if !reaches {
		t.Errorf("NetworkPolicy %s egress does not admit port %d/TCP of the memcached pods (namespace %s, labels %v)", np.Metadata.Name, mcPort, ns, podLabels)
	}
}

// peerAdmits reports whether a NetworkPolicy peer of a policy in namespace policyNS selects
// the pods labelled labels in namespace ns (namespaces known by their name label only).
func peerAdmits(peer policyPeer, policyNS, ns string, labels map[string]string) bool {
	if peer.IPBlock != nil {
		return false // pod addresses are not known here
	}
	if sel := peer.NamespaceSelector; sel == nil {
		if policyNS != ns {
			return false
		}
	} else {
		for k, v := range sel.MatchLabels {
			if k != "kubernetes.io/metadata.name" || v != ns {
				return false
			}
		}
	}
	if sel := peer.PodSelector; sel != nil {
		for k, v := range sel.MatchLabels {
			if labels[k] != v {
				return false
			}
		}
	}
	return true
}

// perHostExample is the install of a moxi on every node: no Deployment, so not among
// k8sInstalls, whose checks are a tier's.
const perHostExample = "examples/per-host"

// The per-host example: a DaemonSet runs moxi on every node, its Service keeps a client's
// connections on its own node (internalTrafficPolicy: Local), and its pod runs this
// release with a config moxi loads, whose ports, probes and mounts agree with it, with few
// connections to each server (every node opens its own).
func TestDeployPerHost(t *testing.T) {
	objs := kustomizeBuild(t, perHostExample)
	byKind := map[string]k8sObject{}
	for _, o := range objs {
		if o.Metadata.Labels[moxiLabel] != "moxi" {
			t.Errorf("%s/%s is not labelled %s=moxi", o.Kind, o.Metadata.Name, moxiLabel)
		}
		byKind[o.Kind] = o
	}
	if kinds := slices.Sorted(maps.Keys(byKind)); len(objs) != 3 || !slices.Equal(kinds, []string{"ConfigMap", "DaemonSet", "Service"}) {
		t.Fatalf("examples/per-host renders %d objects of kinds %q, want a ConfigMap, a DaemonSet and a Service", len(objs), kinds)
	}
	var spec deploymentSpec
	ds, service := byKind["DaemonSet"], byKind["Service"]
	if err := ds.Spec.Decode(&spec); err != nil {
		t.Fatal(err)
	}
	if len(spec.Template.Spec.Containers) != 1 {
		t.Fatalf("want one container, found %d", len(spec.Template.Spec.Containers))
	}
	c := spec.Template.Spec.Containers[0]
	if want := moxiImage + ":" + releaseVersion(t); c.Image != want {
		t.Errorf("image %q, want %q", c.Image, want)
	}
	cfg, err := config.Parse([]byte(byKind["ConfigMap"].Data["moxi.yaml"]), "examples/per-host/moxi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.Index(c.Args, "--config"); i < 0 || i+1 >= len(c.Args) || c.Args[i+1] != "/etc/moxi/moxi.yaml" ||
		!slices.ContainsFunc(c.VolumeMounts, func(m k8sMount) bool { return m.MountPath == "/etc/moxi" && m.SubPath == "" }) {
		t.Errorf("args %q and mounts %+v: want --config /etc/moxi/moxi.yaml from the ConfigMap mounted whole at /etc/moxi", c.Args, c.VolumeMounts)
	}
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["memcache"] != addrPort(t, cfg.Listen) || ports["admin"] != addrPort(t, cfg.Admin) {
		t.Errorf("container ports %v; moxi.yaml listens on %s and %s", ports, cfg.Listen, cfg.Admin)
	}
	for _, p := range []struct {
		probe *k8sProbe
		path  string
	}{{c.ReadinessProbe, "/readyz"}, {c.LivenessProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port != "admin" {
			t.Errorf("probe %+v, want GET %s on port admin", p.probe, p.path)
		}
	}
	for _, pl := range cfg.Pools {
		if pl.Connections > 2 {
			t.Errorf("pool %s opens %d connections to each server from every node: want 1 or 2", pl.Name, pl.Connections)
		}
	}
	var svc struct {
		InternalTrafficPolicy string `yaml:"internalTrafficPolicy"`
		Selector              map[string]string
		Ports                 []struct {
			Port       int `yaml:"port"`
			TargetPort any `yaml:"targetPort"`
		} `yaml:"ports"`
	}
	if err := service.Spec.Decode(&svc); err != nil {
		t.Fatal(err)
	}
	if svc.InternalTrafficPolicy != "Local" || len(svc.Ports) != 1 || svc.Ports[0].TargetPort != "memcache" || svc.Selector[moxiLabel] != "moxi" {
		t.Errorf("Service %+v: want internalTrafficPolicy Local and the port memcache of the moxi pods", svc)
	}
}
