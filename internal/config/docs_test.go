package config

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestBoundsPageKeys keeps docs/resource-bounds.md in step with the config: every key it
// names in backquotes exists, and every bound of the reference example is named.
func TestBoundsPageKeys(t *testing.T) {
	page, err := os.ReadFile("../../docs/resource-bounds.md")
	if err != nil {
		t.Fatal(err)
	}
	// The keys of the reference example, pools written as pools.*.
	b, err := contractConfig().YAML()
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	var walk func(path string, n *yaml.Node)
	walk = func(path string, n *yaml.Node) {
		if n.Kind != yaml.MappingNode {
			keys[path] = true
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i].Value
			if path == "pools" {
				k = "*"
			}
			p := k
			if path != "" {
				p = path + "." + k
			}
			walk(p, n.Content[i+1])
		}
	}
	walk("", doc.Content[0])

	named := map[string]bool{}
	for _, m := range regexp.MustCompile("`((?:limits|hot_cache|fire_and_forget|pools\\.\\*)\\.[a-z_]+)`").FindAllStringSubmatch(string(page), -1) {
		named[m[1]] = true
		if !keys[m[1]] {
			t.Errorf("docs/resource-bounds.md names `%s`, which is not a config key", m[1])
		}
	}
	for _, k := range []string{
		"limits.max_connection_bytes", "limits.max_buffered_bytes", "limits.max_background_bytes",
		"limits.request_timeout", "limits.write_timeout", "hot_cache.max_bytes",
		"fire_and_forget.max_pending_bytes", "pools.*.embedded_memory_mb",
	} {
		if !named[k] {
			t.Errorf("docs/resource-bounds.md does not explain `%s`", k)
		}
	}
	if len(named) == 0 || !strings.Contains(string(page), "moxi_buffered_bytes") {
		t.Error("docs/resource-bounds.md names no bound or no metric")
	}
}
