package config

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/moxi-proxy/moxi/internal/ketama"
)

// canonAddr checks that s is host:port and returns it with the port in canonical decimal
// form, so that "h:011211" and "h:11211" are recognised as one server. A listening
// address may leave the host empty (all interfaces) and use port 0 (any free port, which
// tests rely on); a server address may do neither.
func canonAddr(s string, listening bool) (string, bool) {
	host, port, err := net.SplitHostPort(s)
	if err != nil || (host == "" && !listening) || strings.ContainsAny(host, " \t") {
		return "", false
	}
	lo := 1
	if listening {
		lo = 0
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < lo || p > 65535 || port[0] == '+' || port[0] == '-' {
		return "", false
	}
	return net.JoinHostPort(host, strconv.Itoa(p)), true
}

// RingName is the server's identity on the ring: its Name, else the name twemproxy and
// libmemcached derive from Addr (ketama.ServerName: "host" when the port is 11211, else
// "host:port", an IPv6 host without brackets). Two servers of a pool with one identity
// would share ring points, so Parse rejects that.
func (s Server) RingName() string {
	if s.Name != "" {
		return s.Name
	}
	return ketama.ServerName(s.Addr)
}

// MemberName is the server's name in the pool, as metrics, /servers and stats proxy show
// it: its ring name, after its zone's and a slash when it is in one ("us-east-1a/s0").
func (s Server) MemberName() string {
	if s.Zone != "" {
		return s.Zone + "/" + s.RingName()
	}
	return s.RingName()
}

// badAddr says why s is not a server address. twemproxy writes an IPv6 host bare
// ("::1:11211:1"), which is ambiguous once the weight is optional, so moxi wants brackets
// and says so to someone carrying such a file over.
func badAddr(s string) string {
	msg := fmt.Sprintf("bad address %q: want host:port with a port from 1 to 65535", s)
	if strings.Count(s, ":") > 2 && !strings.Contains(s, "[") {
		msg += `; an IPv6 host goes in brackets, as in "[::1]:11211"`
	}
	return msg
}

// servers reads a pool's server list: each entry a twemproxy-style string or a map.
func (d *decoder) servers(dst *[]Server) field {
	return func(v *yaml.Node, path string) {
		if v.Kind != yaml.SequenceNode {
			d.fail(v, path, "want a list, got %s", describe(v))
			return
		}
		var out []Server
		addrs := map[string]int{}
		names := map[string]int{}
		for i, e := range v.Content {
			e = deref(e)
			at := index(path, i)
			s, ok := d.server(e, at)
			if !ok {
				continue
			}
			if line, dup := addrs[s.Addr]; dup {
				d.fail(e, at, "duplicate server address %s (first at line %d)", s.Addr, line)
				continue
			}
			if line, dup := names[s.RingName()]; dup {
				d.fail(e, at, "duplicate server name %q (first at line %d)", s.RingName(), line)
				continue
			}
			addrs[s.Addr], names[s.RingName()] = s.Line, s.Line
			out = append(out, s)
		}
		*dst = out
	}
}

// server reads one entry of a servers list.
func (d *decoder) server(e *yaml.Node, path string) (Server, bool) {
	s := Server{Weight: 1, Line: e.Line}
	switch {
	case isNull(e):
		d.fail(e, path, "empty server entry")
		return s, false
	case e.Kind == yaml.ScalarNode:
		return d.serverString(e, path)
	case e.Kind != yaml.MappingNode:
		d.fail(e, path, "want \"host:port[:weight] [name]\" or a mapping, got %s", describe(e))
		return s, false
	}
	n := len(d.errs) + d.dropped
	var addr, from string
	seen := d.mapping(e, path, map[string]field{
		"name":         d.str(&s.Name),
		"addr":         d.str(&addr),
		"weight":       d.integer(&s.Weight, 1, maxWeight),
		"migrate_from": d.str(&from),
		"migrate_at":   d.instant(&s.MigrateAt),
	})
	if v := seen["addr"]; v == nil || isNull(v) {
		d.fail(e, join(path, "addr"), "required")
	} else if v.Kind == yaml.ScalarNode {
		if s.Addr, _ = canonAddr(addr, false); s.Addr == "" {
			d.fail(v, join(path, "addr"), "%s", badAddr(addr))
		}
	}
	if v := seen["name"]; v != nil && !isNull(v) && s.Name == "" && v.Kind == yaml.ScalarNode {
		d.fail(v, join(path, "name"), "must not be empty; leave it out to use the address")
	}
	if v := seen["migrate_from"]; v != nil && !isNull(v) && v.Kind == yaml.ScalarNode {
		at := join(path, "migrate_from")
		if s.MigrateFrom, _ = canonAddr(from, false); s.MigrateFrom == "" {
			d.fail(v, at, "%s", badAddr(from))
		} else if s.MigrateFrom == s.Addr {
			d.fail(v, at, "same as addr; a server cannot migrate from itself")
		}
	}
	if v := seen["migrate_at"]; v != nil && !s.MigrateAt.IsZero() && s.MigrateFrom == "" {
		d.fail(v, join(path, "migrate_at"), "needs migrate_from")
	}
	return s, len(d.errs)+d.dropped == n
}

// maxWeight keeps ring sizes sane: ketama gives each server points in proportion to its
// share of the total weight, so only ratios matter and a larger number is a typo.
const maxWeight = 1 << 20

// serverString reads twemproxy's "host:port:weight [name]", with the weight optional
// (default 1) as in "host:port".
func (d *decoder) serverString(e *yaml.Node, path string) (Server, bool) {
	s := Server{Weight: 1, Line: e.Line}
	f := strings.Fields(e.Value)
	if len(f) == 0 || len(f) > 2 {
		d.fail(e, path, "bad server %q: want \"host:port[:weight] [name]\"", e.Value)
		return s, false
	}
	if len(f) == 2 {
		s.Name = f[1]
	}
	addr, ok := canonAddr(f[0], false)
	if !ok {
		// Not host:port, so maybe host:port:weight; an IPv6 host is bracketed, so the
		// last colon is the weight's in either case.
		i := strings.LastIndexByte(f[0], ':')
		if i < 0 {
			d.fail(e, path, "%s", badAddr(f[0]))
			return s, false
		}
		if addr, ok = canonAddr(f[0][:i], false); !ok {
			d.fail(e, path, "%s", badAddr(f[0]))
			return s, false
		}
		w, err := strconv.Atoi(f[0][i+1:])
		switch {
		case err != nil:
			d.fail(e, path, "bad weight %q in %q: want an integer", f[0][i+1:], e.Value)
			return s, false
		case w < 1:
			d.fail(e, path, "weight must be at least 1, got %d", w)
			return s, false
		case w > maxWeight:
			d.fail(e, path, "weight must be at most %d, got %d", maxWeight, w)
			return s, false
		}
		s.Weight = w
	}
	s.Addr = addr
	return s, true
}

// ListenAddr checks a client address given outside the file (the --listen flag) by the
// rules the file's listen follows, and returns it in canonical form: host:port, or the
// path of a Unix socket.
func ListenAddr(s string) (string, error) {
	if UnixSocket(s) {
		if msg := badSocketPath(s); msg != "" {
			return "", errors.New(msg)
		}
		return s, nil
	}
	addr, ok := canonAddr(s, true)
	if !ok {
		return "", fmt.Errorf("%q is not host:port with a port from 0 to 65535, or the path of a Unix socket", s)
	}
	return addr, nil
}

// AdminAddr checks an admin address given outside the file (the --admin flag) by the
// rules the file's admin follows, and returns it in canonical form.
func AdminAddr(s string) (string, error) {
	addr, ok := canonAddr(s, true)
	if !ok {
		return "", fmt.Errorf("%q is not host:port with a port from 0 to 65535", s)
	}
	return addr, nil
}

// maxSocketPath is the longest path a Unix socket address holds on Linux (sun_path is
// 108 bytes, the last one a NUL).
const maxSocketPath = 107

// badSocketPath says why path cannot name a Unix socket, or "" when it can.
func badSocketPath(path string) string {
	switch {
	case len(path) > maxSocketPath:
		return fmt.Sprintf("socket path %q is %d bytes long; a Unix socket's path is at most %d", path, len(path), maxSocketPath)
	case strings.HasSuffix(path, "/"):
		return fmt.Sprintf("socket path %q names a directory; give the socket's file name", path)
	case strings.ContainsAny(path, "\x00"):
		return fmt.Sprintf("socket path %q contains a NUL byte", path)
	}
	return ""
}
