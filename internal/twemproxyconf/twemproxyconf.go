// Package twemproxyconf renders a twemproxy (nutcracker.yml) config as the moxi config that
// serves the same keys from the same servers.
//
// Placement is what must not change when a tier moves from twemproxy to moxi: moxi's ketama
// and modula place keys as twemproxy does, given the same hash, distribution and server
// list. So every pool's hash and distribution are written out (twemproxy's defaults,
// fnv1a_64 and ketama, are not moxi's), and each server entry keeps twemproxy's
// "host:port:weight [name]" form, which moxi reads with the same ring identity, and a
// hash_tag is kept. Each pool keeps its own port too: the first memcached pool's listen is
// moxi's listen, every other pool's is a listener whose default pool it is. What moxi cannot
// do the same way is said in a comment of the output, next to the setting; Redis pools, which
// moxi does not serve, are left out with a warning.
package twemproxyconf

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/hashkit"
)

// Error is one setting of the nutcracker.yml that has no moxi equivalent at all, as
// "file:line: field: message".
type Error struct {
	File  string
	Line  int
	Field string // "alpha.redis"
	Msg   string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s:%d: %s: %s", e.File, e.Line, e.Field, e.Msg)
}

// Convert reads a nutcracker.yml's contents and returns the equivalent moxi config, with
// comments that tell what was left out and why, and the warnings to show whoever converts
// it: one per Redis pool left out (moxi speaks memcached only; most nutcracker files mix
// both). filename is used in comments and messages only. A file that twemproxy would not
// run, or one with no memcached pool, is an error: every such problem, one per line
// (errors.Join of *Error).
func Convert(data []byte, filename string) (out []byte, warnings []string, err error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", filename, err)
	}
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode || len(doc.Content[0].Content) == 0 {
		return nil, nil, fmt.Errorf("%s: no pools: a nutcracker.yml is a mapping of pool names to their settings", filename)
	}
	c := &converter{file: filename}
	top := doc.Content[0]
	var pools []*twemPool
	var redis []string
	for i := 0; i+1 < len(top.Content); i += 2 {
		p := c.pool(top.Content[i], top.Content[i+1])
		if p.redis {
			redis = append(redis, p.name)
			warnings = append(warnings, fmt.Sprintf("%s:%d: %s is a Redis pool, left out: moxi speaks memcached only; keep it on twemproxy",
				filename, p.line, p.name))
			continue
		}
		pools = append(pools, p)
	}
	if len(pools) == 0 && len(c.errs) == 0 {
		return nil, nil, fmt.Errorf("%s: no memcached pool: every pool is a Redis one (%s), and moxi speaks memcached only",
			filename, strings.Join(redis, ", "))
	}
	if len(c.errs) > 0 {
		slices.SortStableFunc(c.errs, func(a, b *Error) int { return a.Line - b.Line })
		errs := make([]error, len(c.errs))
		for i, e := range c.errs {
			errs[i] = e
		}
		return nil, nil, errors.Join(errs...)
	}
	out, err = render(filename, pools, redis)
	if err != nil {
		return nil, nil, err
	}
	return out, warnings, nil
}

// converter collects the errors of one Convert.
type converter struct {
	file string
	errs []*Error
}

func (c *converter) fail(n *yaml.Node, field, format string, args ...any) {
	c.errs = append(c.errs, &Error{File: c.file, Line: n.Line, Field: field, Msg: fmt.Sprintf(format, args...)})
}

// twemPool is one twemproxy pool as moxi settings: settings in output order, each a key and
// its value node, and notes (comments) on the pool as a whole.
type twemPool struct {
	name     string
	listen   string // twemproxy's listen, as moxi's listen takes it; "" when absent
	line     int
	redis    bool         // redis: true — left out
	settings []*yaml.Node // key, value, key, value …
	notes    []string
}

func (p *twemPool) set(key string, value *yaml.Node, comment string) {
	k := scalar(key)
	k.HeadComment = comment
	p.settings = append(p.settings, k, value)
}

// noEjection says what a pool converted from one without auto_eject_hosts does otherwise
// than twemproxy did.
const noEjection = "Unlike twemproxy, which sends every request for such a server's keys to it, moxi marks it dead after\n" +
	"failure_limit failures in a row and then fails its keys at once, without trying it, until a probe\n" +
	"(every dead_backoff, doubling up to dead_backoff_max) succeeds."

// twemproxy's defaults where they differ from moxi's and change behaviour: written out
// when the file leaves them out.
const (
	defaultHash         = "fnv1a_64"
	defaultDistribution = "ketama"
)

// pool converts the settings of the pool at key.
func (c *converter) pool(key, v *yaml.Node) *twemPool {
	p := &twemPool{name: key.Value, line: key.Line}
	at := func(k string) string { return p.name + "." + k }
	if v.Kind != yaml.MappingNode {
		c.fail(v, p.name, "want a mapping of the pool's settings")
		return p
	}
	got := map[string]*yaml.Node{}
	for i := 0; i+1 < len(v.Content); i += 2 {
		got[v.Content[i].Value] = v.Content[i+1]
	}
	if r := got["redis"]; r != nil && r.Value == "true" {
		p.redis = true
		return p
	}

	dist, distNote := defaultDistribution, ""
	if n := got["distribution"]; n != nil {
		switch n.Value {
		case "ketama", "modula":
			dist = n.Value
		case "random":
			distNote = "twemproxy's distribution: random sends each request to any server; moxi has no " +
				"equivalent (a cache needs a key's reads and writes on one server), so this pool uses ketama"
		default:
			c.fail(n, at("distribution"), "unknown distribution %q: twemproxy's are ketama, modula and random", n.Value)
		}
	}
	p.set("distribution", scalar(dist), distNote)
	hash := defaultHash
	if n := got["hash"]; n != nil {
		if _, ok := hashkit.Lookup(n.Value); ok {
			hash = n.Value
		} else {
			c.fail(n, at("hash"), "unknown hash %q: want one of %s", n.Value, strings.Join(hashkit.Names(), ", "))
		}
	}
	p.set("hash", scalar(hash), "")
	if n := got["servers"]; n != nil && n.Kind == yaml.SequenceNode && len(n.Content) > 0 {
		list := &yaml.Node{Kind: yaml.SequenceNode}
		for i, s := range n.Content {
			if spec, ok := c.server(s, fmt.Sprintf("%s[%d]", at("servers"), i)); ok {
				list.Content = append(list.Content, scalar(spec))
			}
		}
		p.set("servers", list, "")
	} else {
		c.fail(v, at("servers"), "required: a list of \"host:port:weight [name]\"")
	}

	// The other keys in the file's order, each converted or noted.
	for i := 0; i+1 < len(v.Content); i += 2 {
		k, n := v.Content[i].Value, v.Content[i+1]
		switch k {
		case "distribution", "hash", "servers", "redis":
			// done above
		case "listen":
			p.listen = c.listen(n, at(k), p)
		case "timeout":
			if d, ok := c.millis(n, at(k)); ok {
				p.set("timeout", scalar(d.String()), "")
			}
		case "server_retry_timeout":
			// twemproxy retries an ejected server at a fixed interval; moxi doubles its wait
			// from dead_backoff up to dead_backoff_max, so both get the interval.
			if d, ok := c.millis(n, at(k)); ok {
				p.set("dead_backoff", scalar(d.String()), "from server_retry_timeout: moxi doubles the wait up to dead_backoff_max; both equal means twemproxy's fixed interval")
				p.set("dead_backoff_max", scalar(d.String()), "")
			}
		case "server_failure_limit":
			if c.positive(n, at(k)) {
				p.set("failure_limit", scalar(n.Value), "")
			}
		case "server_connections":
			if c.positive(n, at(k)) {
				p.set("connections", scalar(n.Value), "")
			}
		case "auto_eject_hosts":
			// written out below: twemproxy's default (false) is not moxi's
		case "hash_tag":
			if len(n.Value) != 2 {
				c.fail(n, at(k), "want two characters, e.g. \"{}\", got %s", strconv.Quote(n.Value))
				continue
			}
			p.set("hash_tag", scalar(n.Value), "")
		case "preconnect":
			p.notes = append(p.notes, "preconnect is left out: moxi connects to every server at startup")
		case "client_connections":
			p.notes = append(p.notes, "client_connections is left out: moxi's bound on clients is limits.max_connections, for all pools together")
		case "backlog", "tcpkeepalive", "reuseport", "redis_auth", "redis_db":
			p.notes = append(p.notes, k+" is left out: moxi has no such setting")
		default:
			p.notes = append(p.notes, fmt.Sprintf("%s (line %d) is left out: not a twemproxy setting moxi knows", k, v.Content[i].Line))
		}
	}
	eject := got["auto_eject_hosts"]
	switch {
	case eject == nil || eject.Value == "false":
		from := "from auto_eject_hosts"
		if eject == nil {
			from = "twemproxy's auto_eject_hosts is false when left out"
		}
		p.set("failover", scalar("false"), from+": a dead server's keys fail until it returns.\n"+noEjection)
	case eject.Value == "true":
		p.set("failover", scalar("true"), "from auto_eject_hosts")
	default:
		c.fail(eject, at("auto_eject_hosts"), "want true or false, got %q", eject.Value)
	}
	p.set("retries", scalar("0"), "twemproxy never sends a failed request again; moxi's default, retries: 1, would (and double the worst-case latency)")
	if got["timeout"] == nil {
		p.notes = append(p.notes, "twemproxy waits for a server forever without timeout; moxi gives each attempt its timeout (default 250ms)")
	}
	return p
}

// server rewrites a twemproxy server entry, "host:port:weight [name]", as moxi's string form
// of the same server: the same words, with an IPv6 host put in brackets (twemproxy writes
// it bare, which moxi does not accept once the weight is optional).
func (c *converter) server(n *yaml.Node, field string) (string, bool) {
	f := strings.Fields(n.Value)
	if n.Kind != yaml.ScalarNode || len(f) == 0 || len(f) > 2 {
		c.fail(n, field, "want \"host:port:weight [name]\", got %q", n.Value)
		return "", false
	}
	if strings.HasPrefix(f[0], "/") {
		path, _, _ := cutLast(f[0])
		c.fail(n, field, "%s is a Unix socket: moxi reaches servers over TCP only", path)
		return "", false
	}
	rest, weight, ok := cutLast(f[0])
	if !ok {
		c.fail(n, field, "want \"host:port:weight [name]\", got %q", n.Value)
		return "", false
	}
	host, port, ok := cutLast(rest)
	if !ok { // host:port without a weight: moxi's default weight is twemproxy's 1 too
		host, port, weight = rest, weight, "1"
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if p, err := strconv.Atoi(port); host == "" || err != nil || p < 1 || p > 65535 {
		c.fail(n, field, "bad address in %q: want host:port with a port from 1 to 65535", n.Value)
		return "", false
	}
	if w, err := strconv.Atoi(weight); err != nil || w < 1 {
		c.fail(n, field, "bad weight %q in %q: want an integer of at least 1", weight, n.Value)
		return "", false
	}
	spec := net.JoinHostPort(host, port) + ":" + weight
	if len(f) == 2 {
		spec += " " + f[1]
	}
	return spec, true
}

// cutLast splits s at its last colon outside brackets.
func cutLast(s string) (before, after string, ok bool) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 || strings.LastIndexByte(s, ']') > i {
		return s, "", false
	}
	return s[:i], s[i+1:], true
}

// listen returns twemproxy's listen as moxi's: host:port, or a socket's path without the
// permissions twemproxy may give after it.
func (c *converter) listen(n *yaml.Node, field string, p *twemPool) string {
	f := strings.Fields(n.Value)
	switch {
	case len(f) == 0:
		c.fail(n, field, "empty")
		return ""
	case strings.HasPrefix(f[0], "/"):
		if len(f) > 1 {
			p.notes = append(p.notes, fmt.Sprintf("the socket's permissions %s are left out: moxi makes its socket 0660", f[1]))
		}
		return f[0]
	}
	return f[0]
}

// millis reads twemproxy's milliseconds as a duration.
func (c *converter) millis(n *yaml.Node, field string) (time.Duration, bool) {
	ms, err := strconv.Atoi(n.Value)
	if err != nil || ms <= 0 {
		c.fail(n, field, "want a positive number of milliseconds, got %q", n.Value)
		return 0, false
	}
	return time.Duration(ms) * time.Millisecond, true
}

func (c *converter) positive(n *yaml.Node, field string) bool {
	if i, err := strconv.Atoi(n.Value); err != nil || i < 1 {
		c.fail(n, field, "want a positive integer, got %q", n.Value)
		return false
	}
	return true
}

// render writes the moxi config for pools: the first pool's listen is moxi's listen and the
// first pool its default_pool; every other pool with a listen address of its own is served
// there, by a listener whose default pool it is, as twemproxy served it. redis names the
// pools left out.
func render(filename string, pools []*twemPool, redis []string) ([]byte, error) {
	root := &yaml.Node{Kind: yaml.MappingNode}
	head := []string{
		"moxi config converted from " + filename + " by moxi --from-twemproxy.",
		"Check it with: moxi --check --config FILE. The admin server (metrics, /servers, /reload) is on moxi's default 127.0.0.1:9151; set admin: to move it.",
	}
	if len(redis) > 0 {
		head = append(head, "Left out: the Redis pools "+strings.Join(redis, ", ")+" (moxi speaks memcached only; keep them on twemproxy).")
	}
	first := pools[0]
	if first.listen != "" {
		k := scalar("listen")
		k.HeadComment = strings.Join(head, "\n")
		root.Content = append(root.Content, k, scalar(first.listen))
	} else {
		first.notes = append(head, first.notes...)
	}
	listeners := &yaml.Node{Kind: yaml.SequenceNode}
	listenedBy := map[string]string{first.listen: first.name}
	for _, p := range pools[1:] {
		switch earlier, taken := listenedBy[p.listen]; {
		case p.listen == "":
			p.notes = append(p.notes, "twemproxy gave "+p.name+" no listen address: here only a route (routes:) reaches it")
		case taken:
			p.notes = append(p.notes, "twemproxy listened for "+p.name+" on "+p.listen+", as for "+earlier+
				": here that port's keys go to "+earlier+"; route a prefix here under routes:")
		default:
			listenedBy[p.listen] = p.name
			listeners.Content = append(listeners.Content, &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{
				scalar("listen"), scalar(p.listen), scalar("default_pool"), scalar(p.name),
			}})
		}
	}
	if len(listeners.Content) > 0 {
		k := scalar("listeners")
		k.HeadComment = "each further pool on its own port, as twemproxy served it"
		root.Content = append(root.Content, k, listeners)
	}
	list := &yaml.Node{Kind: yaml.MappingNode}
	for _, p := range pools {
		k := scalar(p.name)
		k.HeadComment = strings.Join(p.notes, "\n")
		list.Content = append(list.Content, k, &yaml.Node{Kind: yaml.MappingNode, Content: p.settings})
	}
	k := scalar("limits")
	k.HeadComment = "twemproxy refuses flush_all (it closes the connection); true would send it to every server of every pool"
	root.Content = append(root.Content, k, &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{
		scalar("allow_flush_all"), scalar("false"),
	}})
	root.Content = append(root.Content, scalar("pools"), list)
	root.Content = append(root.Content, scalar("default_pool"), scalar(first.name))

	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{root}}); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	// Whatever the checks above missed, a config moxi would refuse is never printed.
	if _, err := config.Parse(b.Bytes(), filename+" (converted)"); err != nil {
		return nil, fmt.Errorf("%s: no equivalent moxi config: %w", filename, err)
	}
	return b.Bytes(), nil
}

func scalar(v string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Value: v}
}
