package config

import (
	"strings"
	"testing"
)

func TestSettings(t *testing.T) {
	cfg, err := Parse([]byte(`
listen: 127.0.0.1:11311
admin: ""
pools:
  main:
    servers: [127.0.0.1:11212, 127.0.0.1:11213]
  sess:
    servers:
      - 127.0.0.1:11214
routes:
  - prefix: "s:"
    pool: sess
default_pool: main
`), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	st, err := cfg.Settings()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, s := range st {
		if _, dup := got[s.Name]; dup {
			t.Errorf("%s listed twice", s.Name)
		}
		got[s.Name] = s.Value
	}
	for name, want := range map[string]string{
		"maxconns":             "10000",
		"item_size_max":        "1048576",
		"tcpport":              "11311",
		"domain_socket":        "NULL",
		"listen":               "127.0.0.1:11311",
		"pools.main.servers":   "127.0.0.1:11212,127.0.0.1:11213",
		"pools.main.timeout":   "250ms",
		"pools.sess.servers":   "127.0.0.1:11214",
		"routes.0.prefix":      "s:",
		"routes.0.pool":        "sess",
		"hot_cache.prefixes":   "NULL",
		"default_pool":         "main",
		"limits.max_key_bytes": "250",
	} {
		if got[name] != want {
			t.Errorf("%s = %q, want %q", name, got[name], want)
		}
	}
}

// TestSettingsHidden: "stats settings" shows no file path and not the admin address, however
// the config names them, and still shows what lies beside them.
func TestSettingsHidden(t *testing.T) {
	c := mustParse(t, `listen: 127.0.0.1:11311
tls:
  cert: /etc/moxi/tls.crt
  key: /etc/moxi/tls.key
  client_ca: /etc/moxi/clients.crt
admin: 127.0.0.1:9151
admin_token_file: /etc/moxi/admin-token
hot_cache:
  peers: ["10.0.0.2:9151"]
  peer_token_file: /etc/moxi/peer-token
hot_keys: {top: 9}
pools:
  main:
    servers: ["10.0.0.1:11211"]
    tls:
      ca: /etc/moxi/ca.crt
      cert: /etc/moxi/client.crt
      key: /etc/moxi/client.key
      server_name: cache.internal
`)
	st, err := c.Settings()
	if err != nil {
		t.Fatal(err)
	}
	shown := map[string]bool{}
	for _, s := range st {
		shown[s.Name] = true
		if strings.Contains(s.Value, "/etc/moxi") || strings.Contains(s.Value, "9151") {
			t.Errorf("STAT %s %s: a file path or the admin address", s.Name, s.Value)
		}
	}
	for _, name := range []string{"listen", "pools.main.servers", "pools.main.tls.server_name", "limits.max_key_bytes", "hot_keys.top", "hot_cache.ttl"} {
		if !shown[name] {
			t.Errorf("%s hidden", name)
		}
	}
	for _, name := range []string{"admin", "admin_token_file", "tls.cert", "tls.key", "tls.client_ca",
		"pools.main.tls.ca", "pools.main.tls.cert", "pools.main.tls.key", "hot_cache.peers", "hot_cache.peer_token_file"} {
		if shown[name] {
			t.Errorf("%s shown", name)
		}
	}
}

// TestHiddenSetting: the table covers keys to come by their form, and only those.
func TestHiddenSetting(t *testing.T) {
	for _, tc := range []struct {
		path   string
		hidden bool
	}{
		{"admin", true},
		{"admin_token_file", true},
		{"auth.users_file", true},
		{"pools.main.sasl.password_file", true},
		{"listeners.0.tls.cert", true},
		{"listeners.0.tls.client_ca", true},
		{"pools.main.tls.ca", true},
		{"listen", false},
		{"listeners.0.listen", false},
		{"pools.main.sasl.user", false},
		{"pools.main.tls.server_name", false},
		{"pools.admin.timeout", false},
		{"pools.tls.servers", false},
		{"hot_cache.max_bytes", false},
		{"hot_cache.peer_token_file", true},
		{"hot_cache.peers", true},
		{"hot_cache.peers_discover.dns", true},
		{"hot_cache.peers_discover.port", true},
		{"hot_cache.peers_discover", false}, // a mapping: its keys are the settings
		{"hot_keys.top", false},
		{"pools.hot_cache.timeout", false},
	} {
		if got := hiddenSetting(tc.path); got != tc.hidden {
			t.Errorf("hiddenSetting(%q) = %v, want %v", tc.path, got, tc.hidden)
		}
	}
}
