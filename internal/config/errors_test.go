package config

import (
	"errors"
	"strings"
	"testing"
)

// TestErrors checks the exact report for each kind of mistake: file, line, field, message.
func TestErrors(t *testing.T) {
	// one is a valid single-pool prefix whose pool "p" is on line 2 and keys follow on line 3.
	const one = "pools:\n  p:\n"
	const two = "pools:\n  a: {embedded: 1}\n  b: {embedded: 1}\ndefault_pool: a\n"
	tests := []struct {
		name, src, want string
	}{
		{"unknown top-level key", "lisen: x\n" + one + "    embedded: 1\n",
			"m.yaml:1: lisen: unknown key; did you mean listen?"},
		{"unknown pool key", one + "    conections: 3\n    embedded: 1\n",
			"m.yaml:3: pools.p.conections: unknown key; did you mean connections?"},
		{"unknown server key", one + "    servers:\n      - {addr: \"h:1\", wieght: 2}\n",
			"m.yaml:4: pools.p.servers[0].wieght: unknown key; did you mean weight?"},
		{"unknown limits key", one + "    embedded: 1\nlimits:\n  max_keys: 3\n",
			"m.yaml:5: limits.max_keys: unknown key"},
		{"unknown hot_cache key", one + "    embedded: 1\nhot_cache: {prefix: [a]}\n",
			"m.yaml:4: hot_cache.prefix: unknown key; did you mean prefixes?"},
		{"merge key", one + "    embedded: 1\n    <<: {timeout: 1s}\n",
			"m.yaml:4: pools.p.<<: merge keys are not supported; repeat the settings"},
		{"duplicate key", one + "    embedded: 1\n    embedded: 2\n",
			"m.yaml:4: pools.p.embedded: duplicate key (first at line 3)"},
		{"duplicate pool", one + "    embedded: 1\n  p:\n    embedded: 1\n",
			"m.yaml:4: pools.p: duplicate key (first at line 2)"},
		{"bad yaml", "pools: [\n", "m.yaml:1: did not find expected node content"},
		{"an unclosed list", "pools:\n  p:\n    servers: [a\n    timeout: 1s\n", "m.yaml:3: did not find expected ',' or ']'"},
		{"an unclosed flow mapping", "a: 1\nb: 2\npools:\n  p:\n    servers:\n    - {addr: \"h:1\"\n    timeout: 1s\n",
			"m.yaml:6: did not find expected ',' or '}'"},
		{"a line indented out of its mapping", "pools:\n  p:\n    embedded: 1\n   timeout: 1s\n", "m.yaml:2: did not find expected key"},
		{"readiness of an unknown pool", two + "readiness:\n  pools: [a, c]\n",
			`m.yaml:6: readiness.pools[1]: no pool named "c"`},
		{"latency buckets not ascending", one + "    embedded: 1\nmetrics:\n  latency_buckets: [0.01, 0.001]\n",
			"m.yaml:5: metrics.latency_buckets[1]: must be greater than the bucket before it (0.01), got 0.001"},
		{"latency bucket not a number", one + "    embedded: 1\nmetrics:\n  latency_buckets: [1ms]\n",
			`m.yaml:5: metrics.latency_buckets[0]: want a number of seconds, got "1ms"`},
		{"a ConfigMap", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: moxi-config}\ndata:\n  moxi.yaml: |\n    pools: {main: {embedded: 1}}\n",
			`m.yaml:1: this is a Kubernetes ConfigMap, not a moxi config: pass the file it holds, moxi.yaml (kubectl get configmap NAME -o jsonpath='{.data.moxi\.yaml}' > moxi.yaml)`},
		{"another Kubernetes object", "apiVersion: apps/v1\nkind: Deployment\n", "m.yaml:1: this is a Kubernetes Deployment, not a moxi config"},
		{"tab indentation", "pools:\n\tp: {}\n", "m.yaml:2: indented with a tab: YAML indents with spaces only"},
		{"tab after spaces", one + "    embedded: 1\n  \t  timeout: 1s\n", "m.yaml:4: indented with a tab: YAML indents with spaces only"},
		{"tab in a value is no syntax error", one + "    embedded: 1\n    hash:\tmd6\n",
			`m.yaml:4: pools.p.hash: unknown hash "md6": want one of crc16, crc32, crc32a, fnv1_32, fnv1_64, fnv1a_32, fnv1a_64, hsieh, jenkins, md5, murmur, one_at_a_time`},
		{"misspelt distribution", one + "    embedded: 1\n    distrbution: ketama\n",
			"m.yaml:4: pools.p.distrbution: unknown key; did you mean distribution?"},
		{"misspelt limits key", one + "    embedded: 1\nlimits: {max_conections: 3}\n",
			"m.yaml:4: limits.max_conections: unknown key; did you mean max_connections?"},
		{"key swapped letters", one + "    embedded: 1\n    tiemout: 1s\n",
			"m.yaml:4: pools.p.tiemout: unknown key; did you mean timeout?"},
		{"key too far from any", one + "    embedded: 1\n    color: red\n",
			"m.yaml:4: pools.p.color: unknown key"},
		{"nutcracker.yml", "alpha:\n  listen: 127.0.0.1:22121\n  hash: fnv1a_64\n  distribution: ketama\n  servers:\n   - 127.0.0.1:11211:1\n",
			"m.yaml:1: alpha: unknown key; this looks like a twemproxy pool (nutcracker.yml): moxi's pools go under pools:, and `moxi --from-twemproxy m.yaml` prints the equivalent moxi config"},
		{"two documents", one + "    embedded: 1\n---\nlisten: x\n", "m.yaml:4: only one YAML document is allowed"},
		{"root not a mapping", "- a\n", "m.yaml:1: want a mapping, got a list"},
		{"empty file", "", "m.yaml: pools: at least one pool is required"},
		{"no pools", "pools: {}\n", "m.yaml:1: pools: at least one pool is required"},
		{"pools not a mapping", "pools: [a]\n", "m.yaml:1: pools: want a mapping, got a list"},
		{"duration without unit", one + "    embedded: 1\n    timeout: 5\n",
			`m.yaml:4: pools.p.timeout: bad duration "5": want Go syntax such as 250ms or 2s`},
		{"duration garbage", one + "    embedded: 1\nhot_cache: {ttl: soon}\n",
			`m.yaml:4: hot_cache.ttl: bad duration "soon": want Go syntax such as 250ms or 2s`},
		{"negative duration", one + "    embedded: 1\nshutdown_timeout: -1s\n",
			"m.yaml:4: shutdown_timeout: must not be negative, got -1s"},
		{"zero timeout", one + "    embedded: 1\n    connect_timeout: 0s\n",
			"m.yaml:4: pools.p.connect_timeout: must be positive, got 0s"},
		{"backoff max below backoff", one + "    embedded: 1\n    dead_backoff: 2s\n    dead_backoff_max: 1s\n",
			"m.yaml:5: pools.p.dead_backoff_max: dead_backoff_max (1s) must not be less than dead_backoff (2s)"},
		{"backoff above default max", one + "    embedded: 1\n    dead_backoff: 1m\n",
			"m.yaml:4: pools.p.dead_backoff: dead_backoff_max (10s) must not be less than dead_backoff (1m0s)"},
		{"server without port", one + "    servers: [localhost]\n",
			`m.yaml:3: pools.p.servers[0]: bad address "localhost": want host:port with a port from 1 to 65535`},
		{"server port zero", one + "    servers: [\"h:0\"]\n",
			`m.yaml:3: pools.p.servers[0]: bad address "h:0": want host:port with a port from 1 to 65535`},
		{"server port too large", one + "    servers: [\"h:65536\"]\n",
			`m.yaml:3: pools.p.servers[0]: bad address "h:65536": want host:port with a port from 1 to 65535`},
		{"server port not numeric", one + "    servers: [\"h:memcache\"]\n",
			`m.yaml:3: pools.p.servers[0]: bad address "h:memcache": want host:port with a port from 1 to 65535`},
		{"server without host", one + "    servers: [\":11211\"]\n",
			`m.yaml:3: pools.p.servers[0]: bad address ":11211": want host:port with a port from 1 to 65535`},
		{"server map bad addr", one + "    servers:\n      - addr: h\n",
			`m.yaml:4: pools.p.servers[0].addr: bad address "h": want host:port with a port from 1 to 65535`},
		{"server map without addr", one + "    servers:\n      - name: a\n",
			"m.yaml:4: pools.p.servers[0].addr: required"},
		{"server map empty name", one + "    servers:\n      - {name: \"\", addr: \"h:1\"}\n",
			"m.yaml:4: pools.p.servers[0].name: must not be empty; leave it out to use the address"},
		{"server too many words", one + "    servers: [\"h:1:1 a b\"]\n",
			`m.yaml:3: pools.p.servers[0]: bad server "h:1:1 a b": want "host:port[:weight] [name]"`},
		{"server empty entry", one + "    servers:\n      -\n",
			"m.yaml:4: pools.p.servers[0]: empty server entry"},
		{"server a list", one + "    servers: [[a]]\n",
			`m.yaml:3: pools.p.servers[0]: want "host:port[:weight] [name]" or a mapping, got a list`},
		{"servers not a list", one + "    servers: \"h:1\"\n",
			`m.yaml:3: pools.p.servers: want a list, got "h:1"`},
		{"bad migrate_from", one + "    servers:\n      - {addr: \"h:1\", migrate_from: \"h\"}\n",
			`m.yaml:4: pools.p.servers[0].migrate_from: bad address "h": want host:port with a port from 1 to 65535`},
		{"migrate_from itself", one + "    servers:\n      - {addr: \"h:1\", migrate_from: \"h:01\"}\n",
			"m.yaml:4: pools.p.servers[0].migrate_from: same as addr; a server cannot migrate from itself"},
		{"migrate_at not a time", one + "    servers:\n      - {addr: \"h:1\", migrate_from: \"h:2\", migrate_at: \"tomorrow\"}\n",
			`m.yaml:4: pools.p.servers[0].migrate_at: want an RFC 3339 time such as 2026-12-01T10:00:00Z: parsing time "tomorrow" as "2006-01-02T15:04:05Z07:00": cannot parse "tomorrow" as "2006"`},
		{"migrate_at alone", one + "    servers:\n      - {addr: \"h:1\", migrate_at: \"2026-12-01T10:00:00Z\"}\n",
			"m.yaml:4: pools.p.servers[0].migrate_at: needs migrate_from"},
		{"weight zero", one + "    servers: [\"h:1:0\"]\n",
			"m.yaml:3: pools.p.servers[0]: weight must be at least 1, got 0"},
		{"weight negative", one + "    servers: [\"h:1:-2\"]\n",
			"m.yaml:3: pools.p.servers[0]: weight must be at least 1, got -2"},
		{"weight not a number", one + "    servers: [\"h:1:x\"]\n",
			`m.yaml:3: pools.p.servers[0]: bad weight "x" in "h:1:x": want an integer`},
		{"weight zero in map", one + "    servers:\n      - {addr: \"h:1\", weight: 0}\n",
			"m.yaml:4: pools.p.servers[0].weight: must be at least 1, got 0"},
		{"duplicate server addr", one + "    servers:\n      - h:1\n      - h:2\n      - h:01:3\n",
			"m.yaml:6: pools.p.servers[2]: duplicate server address h:1 (first at line 4)"},
		{"duplicate server name", one + "    servers:\n      - h:1:1 a\n      - {name: a, addr: \"h:2\"}\n",
			`m.yaml:5: pools.p.servers[1]: duplicate server name "a" (first at line 4)`},
		{"duplicate derived name", one + "    servers:\n      - h:11211\n      - h:2:1 h\n",
			`m.yaml:5: pools.p.servers[1]: duplicate server name "h" (first at line 4)`},
		{"duplicate derived ipv6 name", one + "    servers:\n      - \"[::1]:11211\"\n      - \"[::2]:11212:1 ::1\"\n",
			`m.yaml:5: pools.p.servers[1]: duplicate server name "::1" (first at line 4)`},
		{"ipv6 without brackets", one + "    servers: [\"::1:11211:1\"]\n",
			`m.yaml:3: pools.p.servers[0]: bad address "::1:11211:1": want host:port with a port from 1 to 65535; an IPv6 host goes in brackets, as in "[::1]:11211"`},
		{"ipv6 without brackets in map", one + "    servers:\n      - addr: \"fe80::1:11211\"\n",
			`m.yaml:4: pools.p.servers[0].addr: bad address "fe80::1:11211": want host:port with a port from 1 to 65535; an IPv6 host goes in brackets, as in "[::1]:11211"`},
		{"neither servers nor embedded", one + "    hash: md5\n",
			"m.yaml:2: pools.p: has no servers: give servers, embedded or discover"},
		{"empty servers list", one + "    servers: []\n",
			"m.yaml:2: pools.p: has no servers: give servers, embedded or discover"},
		{"null pool", "pools:\n  p:\n", "m.yaml:2: pools.p: has no servers: give servers, embedded or discover"},
		{"both servers and embedded", one + "    servers: [\"h:1\"]\n    embedded: 2\n",
			"m.yaml:4: pools.p: has both servers and embedded; give one"},
		{"more replicas than servers", one + "    servers: [\"h:1\", \"h:2\"]\n    replicas: 3\n",
			"m.yaml:4: pools.p.replicas: is 3 but the pool has 2 servers"},
		{"more replicas than shards", one + "    embedded: 2\n    replicas: 3\n",
			"m.yaml:4: pools.p.replicas: is 3 but the pool has 2 embedded shards"},
		{"too many replicas", one + "    embedded: 9\n    replicas: 9\n",
			"m.yaml:4: pools.p.replicas: must be at most 8, got 9"},
		{"zones with replicas", one + "    zones:\n      - {name: a, servers: [\"h:1\"]}\n      - {name: b, servers: [\"h:2\"]}\n    replicas: 2\n",
			"m.yaml:6: pools.p.replicas: not with zones: a pool with zones keeps one copy of each key in each zone"},
		{"zones with servers", one + "    servers: [\"h:3\"]\n    zones:\n      - {name: a, servers: [\"h:1\"]}\n",
			"m.yaml:5: pools.p.zones: is instead of servers, embedded and discover: each zone lists its own servers"},
		{"an empty zone", one + "    zones:\n      - {name: a, servers: [\"h:1\"]}\n      - {name: b, servers: []}\n",
			`m.yaml:5: pools.p.zones[1].servers: zone "b" has no servers`},
		{"a zone named twice", one + "    zones:\n      - {name: a, servers: [\"h:1\"]}\n      - {name: a, servers: [\"h:2\"]}\n",
			`m.yaml:5: pools.p.zones[1].name: zone "a" named twice (first at line 4)`},
		{"a zone without a name", one + "    zones:\n      - {servers: [\"h:1\"]}\n",
			"m.yaml:4: pools.p.zones[0].name: required: the zone's name, as --zone names it"},
		{"a server in two zones", one + "    zones:\n      - {name: a, servers: [\"h:1\"]}\n      - {name: b, servers: [\"h:1\"]}\n",
			"m.yaml:5: pools.p.zones[1].servers[0]: duplicate server address h:1 (first at line 4)"},
		{"a zone name with a slash", one + "    zones:\n      - {name: a/b, servers: [\"h:1\"]}\n",
			`m.yaml:4: pools.p.zones[0].name: "a/b": a zone's name has no white space or slash`},
		{"bad write_quorum", one + "    embedded: 2\n    write_quorum: two\n",
			`m.yaml:4: pools.p.write_quorum: unknown write_quorum "two": want one of all, majority, one`},
		{"bad read_from", one + "    embedded: 2\n    read_from: last\n",
			`m.yaml:4: pools.p.read_from: unknown read_from "last": want one of first, random`},
		{"bad distribution", one + "    embedded: 1\n    distribution: random\n",
			`m.yaml:4: pools.p.distribution: unknown distribution "random": want one of ketama, jump, modula`},
		{"bad hash", one + "    embedded: 1\n    hash: sha1\n",
			`m.yaml:4: pools.p.hash: unknown hash "sha1": want one of crc16, crc32, crc32a, fnv1_32, fnv1_64, fnv1a_32, fnv1a_64, hsieh, jenkins, md5, murmur, one_at_a_time`},
		{"route to missing pool", one + "    embedded: 1\nroutes:\n  - {prefix: \"a:\", pool: q}\n",
			`m.yaml:5: routes[0].pool: no pool named "q"`},
		{"route without pool", one + "    embedded: 1\nroutes:\n  - {prefix: \"a:\"}\n",
			"m.yaml:5: routes[0].pool: required"},
		{"route with empty prefix", one + "    embedded: 1\nroutes:\n  - {prefix: \"\", pool: p}\n",
			"m.yaml:5: routes[0].prefix: required and must not be empty; unrouted keys go to default_pool"},
		{"route shadowed", one + "    embedded: 1\nroutes:\n  - {prefix: \"a:\", pool: p}\n  - {prefix: \"a:b\", pool: p}\n",
			`m.yaml:6: routes[1].prefix: never matches: the route at line 5 (prefix "a:") matches first`},
		{"routes not a list", one + "    embedded: 1\nroutes: {prefix: a}\n",
			"m.yaml:4: routes: want a list, got a mapping"},
		{"backup to missing pool", one + "    embedded: 1\n    backup: spare\n",
			`m.yaml:4: pools.p.backup: no pool named "spare"`},
		{"backup to itself", one + "    embedded: 1\n    backup: p\n",
			"m.yaml:4: pools.p.backup: a pool cannot back up to itself"},
		{"backup cycle", "pools:\n  a: {embedded: 1, backup: b}\n  b: {embedded: 1, backup: c}\n  c: {embedded: 1, backup: a}\ndefault_pool: a\n",
			"m.yaml:2: pools.a.backup: backup cycle: a -> b -> c -> a"},
		{"warm_from missing pool", one + "    embedded: 1\n    warm_from: old\n",
			`m.yaml:4: pools.p.warm_from: no pool named "old"`},
		{"warm_from itself", one + "    embedded: 1\n    warm_from: p\n",
			"m.yaml:4: pools.p.warm_from: a pool cannot warm up from itself"},
		{"warm_from chain", "pools:\n  a: {embedded: 1, warm_from: b}\n  b: {embedded: 1, warm_from: c}\n  c: {embedded: 1}\ndefault_pool: a\n",
			"m.yaml:2: pools.a.warm_from: pool b warms up from c itself: chains are not followed, warm up from the pool that holds the data"},
		{"shadow missing pool", one + "    embedded: 1\n    shadow: {pool: q, fraction: 0.1}\n",
			`m.yaml:4: pools.p.shadow.pool: no pool named "q"`},
		{"shadow itself", one + "    embedded: 1\n    shadow: {pool: p, fraction: 0.1}\n",
			"m.yaml:4: pools.p.shadow.pool: a pool cannot shadow to itself"},
		{"shadow fraction over 1", one + "    embedded: 1\n    shadow: {pool: p, fraction: 1.5}\n",
			"m.yaml:4: pools.p.shadow.fraction: must be from 0 to 1 (the share of keys shadowed), got 1.5"},
		{"shadow fraction negative", one + "    embedded: 1\n    shadow:\n      pool: p\n      fraction: -0.1\n",
			"m.yaml:6: pools.p.shadow.fraction: must be from 0 to 1 (the share of keys shadowed), got -0.1"},
		{"shadow fraction not a number", one + "    embedded: 1\n    shadow: {pool: p, fraction: ten}\n",
			`m.yaml:4: pools.p.shadow.fraction: want a number from 0 to 1, got "ten"`},
		{"shadow without pool", one + "    embedded: 1\n    shadow: {fraction: 0.5}\n",
			"m.yaml:4: pools.p.shadow.pool: required with a fraction: the pool that shadow requests go to"},
		{"shadow unknown key", one + "    embedded: 1\n    shadow: {pool: p, fractoin: 0.5}\n",
			"m.yaml:4: pools.p.shadow.fractoin: unknown key; did you mean fraction?"},
		{"default_pool missing", two[:len(two)-2] + "x\n",
			`m.yaml:4: default_pool: no pool named "x"`},
		{"default_pool omitted", two[:strings.Index(two, "default_pool")],
			"m.yaml:1: default_pool: required when there is more than one pool"},
		{"negative max_connections", one + "    embedded: 1\nlimits: {max_connections: -1}\n",
			"m.yaml:4: limits.max_connections: must be at least 1, got -1"},
		{"max_key_bytes over 250", one + "    embedded: 1\nlimits: {max_key_bytes: 251}\n",
			"m.yaml:4: limits.max_key_bytes: must be at most 250, got 251"},
		{"max_value_bytes over 1GiB", one + "    embedded: 1\nlimits: {max_value_bytes: 1073741825}\n",
			"m.yaml:4: limits.max_value_bytes: must be at most 1073741824, got 1073741825"},
		{"negative retries", one + "    embedded: 1\n    retries: -1\n",
			"m.yaml:4: pools.p.retries: must be at least 0, got -1"},
		{"negative embedded", one + "    embedded: -1\n",
			"m.yaml:3: pools.p.embedded: must be at least 0, got -1"},
		{"zero connections", one + "    embedded: 1\n    connections: 0\n",
			"m.yaml:4: pools.p.connections: must be at least 1, got 0"},
		{"negative migrate_rate", one + "    embedded: 1\n    migrate_rate: -5\n",
			"m.yaml:4: pools.p.migrate_rate: must be at least 0, got -5"},
		{"negative max_pending", one + "    embedded: 1\nfire_and_forget: {max_pending: -1}\n",
			"m.yaml:4: fire_and_forget.max_pending: must be at least 1, got -1"},
		{"integer as word", one + "    embedded: one\n",
			`m.yaml:3: pools.p.embedded: want an integer, got "one"`},
		{"integer quoted", one + "    embedded: \"1\"\n",
			`m.yaml:3: pools.p.embedded: want an integer, got "1"`},
		{"integer overflow", one + "    embedded: 99999999999999999999\n",
			`m.yaml:3: pools.p.embedded: want an integer, got "99999999999999999999"`},
		{"bool as yes", one + "    embedded: 1\n    failover: yes\n",
			`m.yaml:4: pools.p.failover: want true or false, got "yes"`},
		{"scalar given a list", one + "    embedded: 1\nlisten: [a]\n",
			"m.yaml:4: listen: want a single value, got a list"},
		{"bad listen", one + "    embedded: 1\nlisten: 11211\n",
			`m.yaml:4: listen: bad address "11211": want host:port with a port from 0 to 65535, or the path of a Unix socket (/run/moxi/moxi.sock)`},
		{"socket path too long", one + "    embedded: 1\nlisten: /" + strings.Repeat("s", 107) + "\n",
			`m.yaml:4: listen: socket path "/` + strings.Repeat("s", 107) + `" is 108 bytes long; a Unix socket's path is at most 107`},
		{"socket path a directory", one + "    embedded: 1\nlisten: /run/moxi/\n",
			`m.yaml:4: listen: socket path "/run/moxi/" names a directory; give the socket's file name`},
		{"admin on a socket", one + "    embedded: 1\nadmin: /run/moxi/admin.sock\n",
			`m.yaml:4: admin: bad address "/run/moxi/admin.sock": want host:port with a port from 0 to 65535, or "" for off`},
		{"tls without cert", one + "    embedded: 1\ntls:\n  key: k.pem\n",
			"m.yaml:5: tls.cert: required: the PEM file of the certificate chain moxi presents"},
		{"tls without key", one + "    embedded: 1\ntls: {cert: c.pem, client_ca: ca.pem}\n",
			"m.yaml:4: tls.key: required: the PEM file of the certificate's private key"},
		{"tls empty", one + "    embedded: 1\ntls: {}\n",
			"m.yaml:4: tls.cert: required: the PEM file of the certificate chain moxi presents\n" +
				"m.yaml:4: tls.key: required: the PEM file of the certificate's private key"},
		{"tls not a mapping", one + "    embedded: 1\ntls: on\n",
			`m.yaml:4: tls: want a mapping, got "on"`},
		{"tls unknown key", one + "    embedded: 1\ntls: {cert: c, key: k, ca: x}\n",
			"m.yaml:4: tls.ca: unknown key"},
		{"pool tls key without cert", one + "    servers: [\"h:1\"]\n    tls:\n      ca: ca.pem\n      key: k.pem\n",
			"m.yaml:6: pools.p.tls.cert: required with key: the PEM file of the client certificate"},
		{"pool tls cert without key", one + "    servers: [\"h:1\"]\n    tls: {cert: c.pem}\n",
			"m.yaml:4: pools.p.tls.key: required with cert: the PEM file of the client certificate's private key"},
		{"pool tls on embedded", one + "    embedded: 1\n    tls: {ca: ca.pem}\n",
			"m.yaml:4: pools.p.tls: an embedded pool has no servers to reach over TLS"},
		{"pool tls unknown key", one + "    servers: [\"h:1\"]\n    tls: {client_ca: x}\n",
			"m.yaml:4: pools.p.tls.client_ca: unknown key"},
		{"bad admin", one + "    embedded: 1\nadmin: localhost\n",
			`m.yaml:4: admin: bad address "localhost": want host:port with a port from 0 to 65535, or "" for off`},
		{"empty prefix", one + "    embedded: 1\nhot_cache: {prefixes: [\"a\", \"\"]}\n",
			"m.yaml:4: hot_cache.prefixes[1]: must not be empty"},
		{"unknown hot_keys key", one + "    embedded: 1\nhot_keys: {tops: 5}\n",
			"m.yaml:4: hot_keys.tops: unknown key; did you mean top?"},
		{"hot_keys not a mapping", one + "    embedded: 1\nhot_keys: true\n",
			`m.yaml:4: hot_keys: want a mapping, got "true"`},
		{"hot_keys top zero", one + "    embedded: 1\nhot_keys: {top: 0}\n",
			"m.yaml:4: hot_keys.top: must be at least 1, got 0"},
		{"hot_keys top too large", one + "    embedded: 1\nhot_keys: {top: 1001}\n",
			"m.yaml:4: hot_keys.top: must be at most 1000, got 1001"},
		{"hot_keys sample zero", one + "    embedded: 1\nhot_keys:\n  sample: 0\n",
			"m.yaml:5: hot_keys.sample: must be more than 0 and at most 1 (the share of requests counted), got 0"},
		{"hot_keys sample over 1", one + "    embedded: 1\nhot_keys: {sample: 1.5}\n",
			"m.yaml:4: hot_keys.sample: must be more than 0 and at most 1 (the share of requests counted), got 1.5"},
		{"hot_keys sample a percentage", one + "    embedded: 1\nhot_keys: {sample: 1%}\n",
			`m.yaml:4: hot_keys.sample: want a number more than 0 and at most 1, got "1%"`},
		{"hot_keys sample nan", one + "    embedded: 1\nhot_keys: {sample: .nan}\n",
			"m.yaml:4: hot_keys.sample: must be more than 0 and at most 1 (the share of requests counted), got .nan"},
		{"hot_keys min_share 1", one + "    embedded: 1\nhot_keys: {min_share: 1}\n",
			"m.yaml:4: hot_keys.min_share: must be more than 0 and less than 1 (a hot key's share of its pool's requests), got 1"},
		{"hot_keys min_share negative", one + "    embedded: 1\nhot_keys: {min_share: -0.1}\n",
			"m.yaml:4: hot_keys.min_share: must be more than 0 and less than 1 (a hot key's share of its pool's requests), got -0.1"},
		{"hot_keys window under 1s", one + "    embedded: 1\nhot_keys: {window: 500ms}\n",
			"m.yaml:4: hot_keys.window: must be at least 1s, got 500ms"},
		{"hot_keys window zero", one + "    embedded: 1\nhot_keys: {window: 0s}\n",
			"m.yaml:4: hot_keys.window: must be positive, got 0s"},
		{"hot_keys window without unit", one + "    embedded: 1\nhot_keys: {window: 10}\n",
			`m.yaml:4: hot_keys.window: bad duration "10": want Go syntax such as 250ms or 2s`},
		{"hot_keys cache yes", one + "    embedded: 1\nhot_keys: {cache: yes}\n",
			`m.yaml:4: hot_keys.cache: want true or false, got "yes"`},
		{"peers without peer_token_file", one + "    embedded: 1\nhot_cache:\n  peers: [\"10.0.0.2:9151\"]\n",
			"m.yaml:5: hot_cache.peer_token_file: required with peers: the file holding the token this tier's moxi present to each other's POST /invalidate"},
		{"peers with an empty peer_token_file", one + "    embedded: 1\nhot_cache:\n  peers: [\"10.0.0.2:9151\"]\n  peer_token_file: \"\"\n",
			"m.yaml:5: hot_cache.peer_token_file: required with peers: the file holding the token this tier's moxi present to each other's POST /invalidate"},
		{"peers_discover without peer_token_file", one + "    embedded: 1\nhot_cache:\n  peers_discover: {dns: moxi.svc}\n",
			"m.yaml:5: hot_cache.peer_token_file: required with peers_discover: the file holding the token this tier's moxi present to each other's POST /invalidate"},
		{"peers and peers_discover", one + "    embedded: 1\nhot_cache:\n  peer_token_file: /t\n  peers: [\"10.0.0.2:9151\"]\n  peers_discover: {dns: moxi.svc}\n",
			"m.yaml:7: hot_cache.peers_discover: is instead of peers: give one"},
		{"peer without port", one + "    embedded: 1\nhot_cache: {peers: [moxi-1], peer_token_file: /t}\n",
			`m.yaml:4: hot_cache.peers[0]: bad address "moxi-1": want host:port with a port from 1 to 65535: another moxi's admin address`},
		{"peer without host", one + "    embedded: 1\nhot_cache: {peers: [\":9151\"], peer_token_file: /t}\n",
			`m.yaml:4: hot_cache.peers[0]: bad address ":9151": want host:port with a port from 1 to 65535: another moxi's admin address`},
		{"peer listed twice", one + "    embedded: 1\nhot_cache:\n  peer_token_file: /t\n  peers:\n    - h:9151\n    - h:09151\n",
			"m.yaml:8: hot_cache.peers[1]: peer h:9151 listed twice"},
		{"peers not a list", one + "    embedded: 1\nhot_cache: {peers: \"h:1\", peer_token_file: /t}\n",
			`m.yaml:4: hot_cache.peers: want a list of admin addresses (host:port), got "h:1"`},
		{"peers_discover without dns", one + "    embedded: 1\nhot_cache: {peers_discover: {srv: true}, peer_token_file: /t}\n",
			"m.yaml:4: hot_cache.peers_discover.dns: required: the name whose records are this tier's other moxi, at their admin port"},
		{"peers_discover config_endpoint", one + "    embedded: 1\nhot_cache: {peers_discover: {config_endpoint: \"c.test:11211\"}, peer_token_file: /t}\n",
			"m.yaml:4: hot_cache.peers_discover.config_endpoint: not here: a configuration endpoint lists memcached nodes; give dns"},
		{"peers_discover unknown key", one + "    embedded: 1\nhot_cache: {peers_discover: {dns: m.svc, prot: 9151}, peer_token_file: /t}\n",
			"m.yaml:4: hot_cache.peers_discover.prot: unknown key; did you mean port?"},
		{"unknown hot_cache key beside peers", one + "    embedded: 1\nhot_cache: {peer_tokn_file: /t}\n",
			"m.yaml:4: hot_cache.peer_tokn_file: unknown key; did you mean peer_token_file?"},
		{"several errors in file order", "routes: [{prefix: \"a\", pool: nope}]\n" + one + "    embedded: x\n    timeout: 5\n",
			"m.yaml:1: routes[0].pool: no pool named \"nope\"\n" +
				"m.yaml:4: pools.p.embedded: want an integer, got \"x\"\n" +
				"m.yaml:5: pools.p.timeout: bad duration \"5\": want Go syntax such as 250ms or 2s"},
		{"auth without users_file", one + "    embedded: 1\nauth: {namespaces: true}\n",
			`m.yaml:4: auth.users_file: required: the file of "user:password" lines clients authenticate with`},
		{"auth.limits of a name no user has", one + "    embedded: 1\nauth:\n  users_file: u\n  limits:\n    \"a:b\": {requests_per_s: 1}\n",
			`m.yaml:7: auth.limits.a:b: not a user name: a users file's names have no colon or space ("*" for every user without an entry)`},
		{"auth.limits negative", one + "    embedded: 1\nauth:\n  users_file: u\n  limits:\n    alice: {requests_per_s: -1}\n",
			"m.yaml:7: auth.limits.alice.requests_per_s: must be at least 0, got -1"},
		{"auth.limits unknown key", one + "    embedded: 1\nauth:\n  users_file: u\n  limits:\n    alice: {request_per_s: 1}\n",
			"m.yaml:7: auth.limits.alice.request_per_s: unknown key; did you mean requests_per_s?"},
		{"auth.limits not a mapping", one + "    embedded: 1\nauth:\n  users_file: u\n  limits: [alice]\n",
			"m.yaml:6: auth.limits: want a mapping, got a list"},
		{"sasl without password_file", one + "    servers: [\"h:1\"]\n    sasl: {user: moxi}\n",
			"m.yaml:4: pools.p.sasl.password_file: required: the file holding the SASL user's password"},
		{"sasl on an embedded pool", one + "    embedded: 1\n    sasl: {user: moxi, password_file: /p}\n",
			"m.yaml:4: pools.p.sasl: an embedded pool has no servers to authenticate to"},
		{"sasl and warm_from", "pools:\n  a: {embedded: 1}\n  c:\n    servers: [\"h:1\"]\n    sasl: {user: moxi, password_file: /p}\n    warm_from: a\ndefault_pool: a\n",
			"m.yaml:6: pools.c.warm_from: not with sasl: servers that require SASL speak only the binary protocol, which a warm-up needs the text protocol beside"},
		{"sasl and migrate_from", one + "    sasl: {user: moxi, password_file: /p}\n    servers:\n      - {addr: \"h:1\", migrate_from: \"h:2\"}\n",
			"m.yaml:5: pools.p.servers[0].migrate_from: not with sasl: servers that require SASL speak only the binary protocol, which a migration needs the text protocol beside"},
		{"warm_from a sasl pool", "pools:\n  c:\n    servers: [\"h:1\"]\n    sasl: {user: moxi, password_file: /p}\n  d:\n    servers: [\"h:2\"]\n    warm_from: c\ndefault_pool: d\n",
			"m.yaml:7: pools.d.warm_from: pool c has sasl: its servers speak only the binary protocol, and a warm-up reads in the text protocol"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.src), "m.yaml")
			if err == nil {
				t.Fatalf("Parse(%q) = %+v, want error %q", tt.src, c, tt.want)
			}
			if c != nil {
				t.Errorf("Parse returned a config along with an error")
			}
			if got := err.Error(); got != tt.want {
				t.Errorf("Parse(%q) error:\n%s\nwant:\n%s", tt.src, got, tt.want)
			}
		})
	}
}

// TestErrorType checks that callers can get at the position and field of a problem.
func TestErrorType(t *testing.T) {
	_, err := Parse([]byte("pools:\n  p:\n    embedded: 1\n    conections: 3\n"), "moxi.yaml")
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v is not an *Error", err)
	}
	want := Error{File: "moxi.yaml", Line: 4, Field: "pools.p.conections", Msg: "unknown key; did you mean connections?"}
	if *e != want {
		t.Errorf("got %+v, want %+v", *e, want)
	}
}

// TestTooManyErrors checks that a long report is cut, with the rest counted.
func TestTooManyErrors(t *testing.T) {
	src := "pools:\n  p:\n    embedded: 1\n" + strings.Repeat("    x: 1\n", maxErrors+5)
	_, err := Parse([]byte(src), "m.yaml")
	if err == nil {
		t.Fatal("no error")
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != maxErrors+1 {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), maxErrors+1, err)
	}
	if lines[0] != "m.yaml:4: pools.p.x: unknown key" {
		t.Errorf("first line %q", lines[0])
	}
	if lines[1] != "m.yaml:5: pools.p.x: duplicate key (first at line 4)" {
		t.Errorf("second line %q", lines[1])
	}
	if last := lines[maxErrors]; last != "m.yaml: 5 more errors not shown" {
		t.Errorf("last line %q", last)
	}
}

// TestCheckLoops: a server that is one of moxi's own listen addresses, as the flags left
// them, is refused; another port, or a Unix socket, is not.
func TestCheckLoops(t *testing.T) {
	for _, c := range []struct {
		listen, server, want string
	}{
		{"127.0.0.1:11211", "localhost:11211", "m.yaml:3: pools.p.servers[0]: localhost:11211 is moxi's own listen address 127.0.0.1:11211: its keys' requests would come back to moxi, endlessly"},
		{":11211", "10.0.0.5:11211", "m.yaml:3: pools.p.servers[0]: 10.0.0.5:11211 is moxi's own listen address :11211: its keys' requests would come back to moxi, endlessly"},
		{"127.0.0.1:11211", "127.0.0.1:11212", ""},
		{"10.0.0.1:11211", "10.0.0.2:11211", ""},
		{"/run/moxi.sock", "127.0.0.1:11211", ""},
	} {
		cfg, err := Parse([]byte("pools:\n  p:\n    servers: [\""+c.server+"\"]\n"), "m.yaml")
		if err != nil {
			t.Fatal(err)
		}
		cfg.Listen = c.listen // as --listen sets it
		got := ""
		if err := cfg.CheckLoops("m.yaml"); err != nil {
			got = err.Error()
		}
		if got != c.want {
			t.Errorf("listen %s, server %s: %q, want %q", c.listen, c.server, got, c.want)
		}
	}
}
