package config

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// unknownKey is the message for key, which fields does not have, at path: "unknown key",
// followed by the likeliest fix when there is one, so that a typo or a file of the wrong
// kind is answered with what to write instead.
func (d *decoder) unknownKey(key string, v *yaml.Node, path string, fields map[string]field) string {
	if path == "" && twemproxyPool(v) {
		// A pasted nutcracker.yml: its top level is pool names.
		return fmt.Sprintf("unknown key; this looks like a twemproxy pool (nutcracker.yml): "+
			"moxi's pools go under pools:, and `moxi --from-twemproxy %s` prints the equivalent moxi config", d.file)
	}
	if near := nearest(key, fields); near != "" {
		return "unknown key; did you mean " + near + "?"
	}
	return "unknown key"
}

// kubernetesObject is what to say of a file that is a Kubernetes object (apiVersion and
// kind at the top) rather than a moxi config — for a ConfigMap, which file of its data to
// pass — or "" when it is not one.
func kubernetesObject(root *yaml.Node) string {
	var kind string
	var data *yaml.Node
	api := false
	for i := 0; i+1 < len(root.Content); i += 2 {
		switch k, v := root.Content[i].Value, deref(root.Content[i+1]); k {
		case "apiVersion":
			api = true
		case "kind":
			kind = v.Value
		case "data":
			data = v
		}
	}
	if !api || kind == "" {
		return ""
	}
	if kind != "ConfigMap" {
		return fmt.Sprintf("this is a Kubernetes %s, not a moxi config", kind)
	}
	file := "moxi.yaml"
	if data != nil && data.Kind == yaml.MappingNode && len(data.Content) > 0 && !slices.ContainsFunc(data.Content, func(n *yaml.Node) bool { return n.Value == file }) {
		file = data.Content[0].Value
	}
	return fmt.Sprintf("this is a Kubernetes ConfigMap, not a moxi config: pass the file it holds, %s "+
		"(kubectl get configmap NAME -o jsonpath='{.data.%s}' > %s)", file, strings.ReplaceAll(file, ".", `\.`), file)
}

// twemproxyPool reports whether v looks like the settings of a twemproxy pool: a mapping
// with servers or listen and no key that only moxi has.
func twemproxyPool(v *yaml.Node) bool {
	if v.Kind != yaml.MappingNode {
		return false
	}
	found := false
	for i := 0; i+1 < len(v.Content); i += 2 {
		switch v.Content[i].Value {
		case "servers", "listen", "auto_eject_hosts", "server_retry_timeout", "server_failure_limit", "redis":
			found = true
		}
	}
	return found
}

// nearest is the key of fields closest to key by edit distance, when it is close enough to
// be a typo of it (a third of the name or less, at most 2 edits); else "". Ties go to the
// first in alphabetical order, so the answer does not vary from run to run.
func nearest(key string, fields map[string]field) string {
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	slices.Sort(names)
	best, bestDist := "", 3
	for _, name := range names {
		dist := editDistance(key, name)
		if dist < bestDist && 3*dist <= max(len(key), len(name)) {
			best, bestDist = name, dist
		}
	}
	return best
}

// editDistance counts the insertions, deletions, substitutions and swaps of two adjacent
// characters that turn a into b (optimal string alignment distance): "wieght" is one swap
// from "weight".
func editDistance(a, b string) int {
	// Three rows of the dynamic-programming table: two back, one back, this one.
	prev2 := make([]int, len(b)+1)
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(b)]
}

// tabLine is the first line of data indented with a tab, and 0 when none is: yaml.v3 says
// "found character that cannot start any token" there, which does not name the tab.
func tabLine(data []byte) int {
	for i, line := range bytes.Split(data, []byte("\n")) {
		indent := line[:len(line)-len(bytes.TrimLeft(line, " \t"))]
		if bytes.IndexByte(indent, '\t') >= 0 && len(strings.TrimSpace(string(line))) > 0 {
			return i + 1
		}
	}
	return 0
}
