package config

import "testing"

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
		"admin":                "NULL",
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
