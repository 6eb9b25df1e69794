package test

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"io"
	"io/fs"
	"maps"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/prometheus/common/model"
	"gopkg.in/yaml.v3"

	"github.com/moxi-proxy/moxi/internal/config"
)

// The deployment files are checked against the code they deploy, with the tools an operator
// runs them with: the configs they ship must load, the manifests kustomize renders must probe
// the ports and paths moxi serves and run this release's image, promtool must accept the
// alerts, and the dashboard must chart every metric family moxi exports and no other.

const (
	deployDir  = "../deploy"
	configsDir = "../configs"
)

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
	var args, buildArgs map[string]*string // the current stage's ARGs, and those the go build sees: name → default (nil: none)
	for _, in := range dockerfile(t) {
		switch in.cmd {
		case "ARG":
			name, def, ok := strings.Cut(in.args, "=")
			if args != nil {
				args[name] = nil
				if ok {
					args[name] = &def
				}
			}
		case "FROM":
			args = map[string]*string{}
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
				build, buildArgs = in.args, maps.Clone(args)
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
	testDockerVersion(t, build, buildArgs)

	// -X of a variable that does not exist is silently ignored, so make sure it exists.
	main, err := os.ReadFile("../cmd/moxi/main.go")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^var version\b`).Match(main) {
		t.Error("cmd/moxi/main.go has no package-level `var version` for -X main.version to set")
	}
}

// versionWord is the shell word -X main.version= is followed by in the go build step.
var versionWord = regexp.MustCompile(`-X main\.version=`)

// testDockerVersion checks the build string the image's binary gets: the release in the
// VERSION file unless the build arg VERSION names another. No Docker engine runs here, so the
// build stage's shell expansion of that word runs in the repository root, which is what the
// stage's WORKDIR holds (COPY . .).
func testDockerVersion(t *testing.T, build string, args map[string]*string) {
	t.Helper()
	loc := versionWord.FindStringIndex(build)
	if loc == nil {
		return // reported with the other go build flags
	}
	word := shellWord(build[loc[1]:])
	def, declared := args["VERSION"]
	if !declared {
		t.Fatalf("the build stage declares no ARG VERSION: --build-arg VERSION=... could not override the build string %s", word)
	}
	release := releaseVersion(t)
	for _, c := range []struct {
		name string
		arg  *string // the build arg's value, nil when not given
		want string
	}{
		{"default", def, release},
		{"--build-arg VERSION=v2.0.0-5-gabc1234", ptr("v2.0.0-5-gabc1234"), "v2.0.0-5-gabc1234"},
	} {
		cmd := exec.Command("sh", "-c", `printf %s "`+word+`"`)
		cmd.Dir = ".."
		cmd.Env = slices.DeleteFunc(os.Environ(), func(e string) bool { return strings.HasPrefix(e, "VERSION=") })
		if c.arg != nil {
			cmd.Env = append(cmd.Env, "VERSION="+*c.arg)
		}
		out, err := cmd.Output()
		if err != nil {
			t.Errorf("%s: sh -c 'printf %%s \"%s\"': %v", c.name, word, err)
		} else if string(out) != c.want {
			t.Errorf("%s: -X main.version=%s stamps %q, want %q (../VERSION holds the release)", c.name, word, out, c.want)
		}
	}
}

func ptr(s string) *string { return &s }

// shellWord is the shell word s starts with: up to the first blank or quote that is not
// inside ${...} or $(...).
func shellWord(s string) string {
	depth := 0
	for i, r := range s {
		switch {
		case r == '{' || r == '(':
			depth++
		case r == '}' || r == ')':
			depth--
		case depth == 0 && (r == ' ' || r == '"' || r == '\''):
			return s[:i]
		}
	}
	return s
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
	if one("Type") != "notify" || one("NotifyAccess") != "all" {
		t.Errorf("Type=%q NotifyAccess=%q, want notify and all: moxi says when it serves, and after an upgrade in place the new process announces itself as the main one", one("Type"), one("NotifyAccess"))
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
	d := k8sDeployment(t, exampleOverlay) // the install with the PodMonitor
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
	for _, m := range exportedFamilies {
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

// repoPath is a relative path in a deploy file: a run of path segments after a blank, a
// quote, a bracket or '='. What follows '/' or ':' (absolute paths, URLs) never starts one.
var repoPath = regexp.MustCompile("(?:^|[\\s\"'`(\\[=,])((?:[A-Za-z0-9_.-]+/)+[A-Za-z0-9_.-]*)")

// repoDirs are the repository's top-level directories: a path of two segments or more that
// starts with one names a file of the repository even without an extension (one segment may
// be kubectl's: deploy/moxi is the Deployment moxi).
var repoDirs = []string{"bench/", "cmd/", "configs/", "deploy/", "docs/", "internal/", "scripts/", "test/"}

// Every repository path the deploy files name exists: relative to the file, to one of the
// directories above it, or to the repository root (deploy/README.md says
// deploy/kubernetes/..., prometheus.yml says kubernetes/...). Paths of the host (/etc/moxi)
// and of the operator's own files (my-config/token) are neither, and are not checked.
func TestDeployPathsExist(t *testing.T) {
	err := filepath.WalkDir(deployDir, func(file string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		for _, m := range repoPath.FindAllStringSubmatch(string(data), -1) {
			p := strings.TrimRight(m[1], ".")
			ext := filepath.Ext(p)
			known := slices.Contains([]string{".yaml", ".yml", ".json", ".md", ".go", ".sh", ".service"}, ext) || path.Base(p) == "Dockerfile"
			relative := strings.HasPrefix(p, "../")
			inRepoDir := strings.Count(p, "/") >= 2 && slices.ContainsFunc(repoDirs, func(d string) bool { return strings.HasPrefix(p, d) })
			if !known && !relative && !inRepoDir {
				continue
			}
			dirs := []string{filepath.Dir(file)}
			for dir := filepath.Dir(file); !relative && dir != ".."; dir = filepath.Dir(dir) {
				dirs = append(dirs, filepath.Dir(dir))
			}
			if !slices.ContainsFunc(dirs, func(dir string) bool {
				_, err := os.Stat(filepath.Join(dir, p))
				return err == nil
			}) {
				t.Errorf("%s names %s, which is not in the repository (looked in %q)", file, p, dirs)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// imageTag is a tag of moxi's image written in a deploy file; a tag computed by the shell
// ($(cat VERSION)) is no match.
var imageTag = regexp.MustCompile(regexp.QuoteMeta(moxiImage) + `:([A-Za-z0-9_.-]+)`)

// Every tag of moxi's image that the deploy files write is the release in ../VERSION: a
// release bump that forgets one fails here (the rendered manifests: TestDeployKubernetes).
func TestDeployImageTags(t *testing.T) {
	release := releaseVersion(t)
	found := 0
	err := filepath.WalkDir(deployDir, func(file string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(file)
		for _, m := range imageTag.FindAllStringSubmatch(string(data), -1) {
			found++
			if m[1] != release {
				t.Errorf("%s: %s, but ../VERSION is %s", file, m[0], release)
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if found == 0 {
		t.Errorf("no deploy file names %s:<tag>", moxiImage)
	}
}
