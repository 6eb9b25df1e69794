package config

import "testing"

// TestDefaultYAML pins what `moxi --check` prints for the built-in default: every value is
// the documented default (docs/configuration.md), written out in the file's key order.
func TestDefaultYAML(t *testing.T) {
	const want = `listen: 127.0.0.1:11211
admin: 127.0.0.1:9151
shutdown_timeout: 10s
limits:
  max_connections: 10000
  max_key_bytes: 250
  max_value_bytes: 1048576
  max_multiget_keys: 10000
  allow_flush_all: true
  max_buffered_bytes: 67108864
  max_connection_bytes: 4194304
  max_background_bytes: 67108864
  request_timeout: 30s
  write_timeout: 30s
watch_config: true
pools:
  main:
    distribution: ketama
    hash: md5
    connections: 4
    connect_timeout: 1s
    timeout: 250ms
    retries: 1
    failure_limit: 2
    dead_backoff: 100ms
    dead_backoff_max: 10s
    failover: true
    failover_ttl: 5m0s
    embedded: 2
    embedded_memory_mb: 64
    migrate_rate: 0
    replicas: 1
    write_quorum: all
    read_from: first
default_pool: main
dedup: true
hot_cache:
  prefixes: []
  max_items: 100000
  max_bytes: 67108864
  ttl: 2s
fire_and_forget:
  prefixes: []
  max_pending: 10000
  max_pending_bytes: 67108864
readiness:
  pools: []
metrics:
  per_server: true
  latency_buckets: []
`
	b, err := Default().YAML()
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != want {
		t.Errorf("Default().YAML() =\n%s\nwant:\n%s", b, want)
	}
}

// TestNewPoolIsFresh: callers may change what NewPool and Default return without touching
// the defaults anyone else gets.
func TestNewPoolIsFresh(t *testing.T) {
	p := NewPool("a")
	p.Timeout, p.Servers = 0, append(p.Servers, Server{Addr: "h:1", Weight: 1})
	if q := NewPool("a"); q.Timeout == 0 || q.Servers != nil {
		t.Errorf("NewPool after a change = %+v", q)
	}
	c := Default()
	c.Pools[0].Embedded, c.Limits.MaxKeyBytes = 9, 1
	if d := Default(); d.Pools[0].Embedded != 2 || d.Limits.MaxKeyBytes != 250 {
		t.Errorf("Default after a change = %+v", d)
	}
}
