package config

import (
	"net"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Setting is one line of "stats settings": a name and its value.
type Setting struct{ Name, Value string }

// Settings lists the effective config for "stats settings": first the few settings memcached
// also has, under memcached's names (so tools that read them find them; evictions and cas
// are what the servers behind a proxy do, flush_enabled is limits.allow_flush_all unless
// auth.namespaces refuses flush_all), then every key of
// YAML's rendering but the hidden ones (hiddenSettings), named by its path
// ("pools.main.timeout", "routes.0.prefix"), lists joined by commas and empty strings shown
// as NULL, as memcached shows an unset setting.
func (c *Config) Settings() ([]Setting, error) {
	socket, port := "NULL", "0"
	if UnixSocket(c.Listen) {
		socket = c.Listen
	} else if _, p, err := net.SplitHostPort(c.Listen); err == nil {
		port = p
	}
	flush := "yes"
	if !c.Limits.AllowFlushAll || c.Auth != nil && c.Auth.Namespaces {
		flush = "no"
	}
	out := []Setting{
		{"maxconns", strconv.Itoa(c.Limits.MaxConnections)},
		{"tcpport", port},
		{"domain_socket", socket},
		{"item_size_max", strconv.Itoa(c.Limits.MaxValueBytes)},
		{"binding_protocol", "auto-negotiate"},
		{"evictions", "on"},
		{"cas_enabled", "yes"},
		{"flush_enabled", flush},
	}
	b, err := c.YAML()
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	if len(doc.Content) == 1 {
		out = flattenSettings(out, "", doc.Content[0])
	}
	return out, nil
}

func flattenSettings(out []Setting, path string, n *yaml.Node) []Setting {
	name := func(key string) string {
		if path == "" {
			return key
		}
		return path + "." + key
	}
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			out = flattenSettings(out, name(n.Content[i].Value), n.Content[i+1])
		}
	case yaml.SequenceNode:
		scalars := make([]string, 0, len(n.Content))
		for _, e := range n.Content {
			if e.Kind != yaml.ScalarNode {
				scalars = nil
				break
			}
			scalars = append(scalars, e.Value)
		}
		if scalars != nil || len(n.Content) == 0 {
			return appendSetting(out, path, strings.Join(scalars, ","))
		}
		for i, e := range n.Content {
			out = flattenSettings(out, name(strconv.Itoa(i)), e)
		}
	default:
		out = appendSetting(out, path, n.Value)
	}
	return out
}

// appendSetting appends the setting at path unless it is hidden (hiddenSettings).
func appendSetting(out []Setting, path, value string) []Setting {
	if hiddenSetting(path) {
		return out
	}
	return append(out, Setting{path, settingValue(value)})
}

// hiddenSettings are the keys "stats settings" never shows: the data port reveals neither an
// admin address (moxi's own, or its peers') nor where a secret lies on disk. An entry
// matches the end of a key's path, whole elements ("tls.key" hides tls.key,
// pools.main.tls.key, listeners.0.tls.key); one beginning with "*" matches the end of the
// key's last element; one ending in ".*" matches every key below the rest of it. A new key
// naming a file is one more line, unless it ends in "_file".
var hiddenSettings = []string{
	"admin",
	"*_file", // admin_token_file, auth.users_file, pools.*.sasl.password_file, hot_cache.peer_token_file
	"tls.cert",
	"tls.key",
	"tls.client_ca",
	"tls.ca",
	"hot_cache.peers",            // the peers' admin addresses
	"hot_cache.peers_discover.*", // where to find them
	"auth.limits.*",              // the users' names: one tenant's client is not told the others'
}

func hiddenSetting(path string) bool {
	last := path[strings.LastIndexByte(path, '.')+1:]
	for _, h := range hiddenSettings {
		if suffix, ok := strings.CutPrefix(h, "*"); ok {
			if strings.HasSuffix(last, suffix) {
				return true
			}
		} else if section, ok := strings.CutSuffix(h, ".*"); ok {
			if strings.HasPrefix(path, section+".") || strings.Contains(path, "."+section+".") {
				return true
			}
		} else if path == h || strings.HasSuffix(path, "."+h) {
			return true
		}
	}
	return false
}

// settingValue keeps a STAT line three fields long: memcached shows what is unset as NULL,
// and a value never holds a space.
func settingValue(v string) string {
	if v == "" {
		return "NULL"
	}
	return strings.ReplaceAll(v, " ", "_")
}
