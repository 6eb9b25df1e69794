package config

import (
	"crypto/tls"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/moxi-proxy/moxi/internal/tlsfiles"
	"github.com/moxi-proxy/moxi/internal/tlstest"
)

// TestTLSForms parses the tls sections and the listen forms they go with.
func TestTLSForms(t *testing.T) {
	c := mustParse(t, `listen: /run/moxi/moxi.sock
tls:
  cert: /etc/moxi/tls.crt
  key: /etc/moxi/tls.key
  client_ca: /etc/moxi/clients.crt
pools:
  a:
    servers: ["10.0.0.1:11211"]
    tls:
      ca: /etc/moxi/ca.crt
      cert: /etc/moxi/client.crt
      key: /etc/moxi/client.key
      server_name: cache.internal
  b:
    servers: ["10.0.0.2:11211"]
    tls: {}
  c:
    servers: ["10.0.0.3:11211"]
    tls:
default_pool: a
`)
	if c.Listen != "/run/moxi/moxi.sock" || !UnixSocket(c.Listen) {
		t.Errorf("listen = %q", c.Listen)
	}
	if want := (&TLS{Cert: "/etc/moxi/tls.crt", Key: "/etc/moxi/tls.key", ClientCA: "/etc/moxi/clients.crt", Line: 3}); !reflect.DeepEqual(c.TLS, want) {
		t.Errorf("tls = %+v, want %+v", c.TLS, want)
	}
	want := &PoolTLS{CA: "/etc/moxi/ca.crt", Cert: "/etc/moxi/client.crt", Key: "/etc/moxi/client.key", ServerName: "cache.internal", Line: 10}
	if got := c.Pool("a").TLS; !reflect.DeepEqual(got, want) {
		t.Errorf("pools.a.tls = %+v, want %+v", got, want)
	}
	if got := c.Pool("b").TLS; !reflect.DeepEqual(got, &PoolTLS{Line: 16}) {
		t.Errorf("pools.b.tls (empty: system roots) = %+v", got)
	}
	if got := c.Pool("c").TLS; got != nil {
		t.Errorf("pools.c.tls (null: off) = %+v", got)
	}

	// Written out and read back, nothing is lost.
	b, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	back := mustParse(t, string(b))
	for _, cc := range []*Config{c, back} {
		cc.TLS.Line = 0
		for _, p := range cc.Pools {
			if p.TLS != nil {
				p.TLS.Line = 0
			}
		}
	}
	equal(t, withoutLines(back), withoutLines(c))

	for _, listen := range []string{"./moxi.sock", "run/moxi.sock", "/tmp/m"} {
		if got := mustParse(t, "listen: "+listen+"\npools: {p: {embedded: 1}}\n").Listen; got != listen {
			t.Errorf("listen %s parsed as %q", listen, got)
		}
		if got, err := ListenAddr(listen); err != nil || got != listen {
			t.Errorf("ListenAddr(%q) = %q, %v", listen, got, err)
		}
		if _, err := AdminAddr(listen); err == nil {
			t.Errorf("AdminAddr(%q) accepted a socket path", listen)
		}
	}
	if _, err := ListenAddr("/" + strings.Repeat("x", 200)); err == nil {
		t.Error("ListenAddr accepted a socket path longer than sun_path")
	}
}

// TestLoadTLS reads the files the tls sections name, and reports those it cannot use as
// Parse reports a bad value: file, line, the field naming the file, and why.
func TestLoadTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	srv := ca.Issue(t, dir, "server")
	other := ca.Issue(t, dir, "other")
	missing, junk := tlstest.BadFiles(t, dir)
	file := func(listen, pool string) string {
		return "pools:\n  p:\n    servers: [\"127.0.0.1:11211\"]\n" + pool + listen
	}
	listenTLS := func(cert, key, ca string) string {
		s := "tls:\n  cert: " + cert + "\n  key: " + key + "\n"
		if ca != "" {
			s += "  client_ca: " + ca + "\n"
		}
		return s
	}
	poolTLS := func(ca, cert, key string) string {
		s := "    tls:\n      ca: " + ca + "\n"
		if cert != "" {
			s += "      cert: " + cert + "\n      key: " + key + "\n"
		}
		return s
	}

	c := mustParse(t, file(listenTLS(srv.CertFile, srv.KeyFile, ca.CertFile), poolTLS(ca.CertFile, other.CertFile, other.KeyFile)))
	if err := c.LoadTLS("m.yaml"); err != nil {
		t.Fatal(err)
	}
	if c.TLS.Config == nil || c.TLS.Config.ClientAuth != tls.RequireAndVerifyClientCert || c.TLS.Sum == (tlsfiles.Sum{}) {
		t.Errorf("tls loaded as %+v", c.TLS)
	}
	if p := c.Pools[0].TLS; p.Config == nil || p.Config.RootCAs == nil || len(p.Config.Certificates) != 1 || p.Sum == (tlsfiles.Sum{}) {
		t.Errorf("pools.p.tls loaded as %+v", p)
	}

	tests := []struct {
		name, src, want string
	}{
		{"missing cert", file(listenTLS(missing, srv.KeyFile, ""), ""),
			"m.yaml:5: tls.cert: " + missing + ": no such file or directory"},
		{"missing key", file(listenTLS(srv.CertFile, missing, ""), ""),
			"m.yaml:5: tls.key: " + missing + ": no such file or directory"},
		{"key of another certificate", file(listenTLS(srv.CertFile, other.KeyFile, ""), ""),
			"m.yaml:5: tls.key: " + other.KeyFile + ": tls: private key does not match public key"},
		{"client_ca not PEM", file(listenTLS(srv.CertFile, srv.KeyFile, junk), ""),
			"m.yaml:5: tls.client_ca: " + junk + ": no PEM certificate found"},
		{"pool ca missing", file("", poolTLS(missing, "", "")),
			"m.yaml:5: pools.p.tls.ca: " + missing + ": no such file or directory"},
		{"pool cert not PEM", file("", poolTLS(ca.CertFile, junk, other.KeyFile)),
			"m.yaml:5: pools.p.tls.cert: " + junk + ": tls: failed to find any PEM data in certificate input"},
		{"a directory", file("", poolTLS(dir, "", "")),
			"m.yaml:5: pools.p.tls.ca: " + dir + ": not a regular file (d---------)"},
		{"both sides at once", file(listenTLS(missing, srv.KeyFile, ""), poolTLS(missing, "", "")),
			"m.yaml:5: pools.p.tls.ca: " + missing + ": no such file or directory\n" +
				"m.yaml:7: tls.cert: " + missing + ": no such file or directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustParse(t, tt.src)
			before := *c
			err := c.LoadTLS("m.yaml")
			if err == nil || err.Error() != tt.want {
				t.Fatalf("LoadTLS error:\n%v\nwant:\n%s", err, tt.want)
			}
			var e *Error
			if !errors.As(err, &e) || e.Line == 0 {
				t.Errorf("error %v is not an *Error with a line", err)
			}
			if !reflect.DeepEqual(*c, before) || (c.TLS != nil && c.TLS.Config != nil) {
				t.Error("a failed LoadTLS changed the config")
			}
		})
	}
}

// TestDiffTLS: the reload summary tells a rotation, a change of files, and an on/off
// switch of the listener's TLS, which takes a restart.
func TestDiffTLS(t *testing.T) {
	base := "pools:\n  p:\n    servers: [\"h:1\"]\n"
	parse := func(src string, sum byte) *Config {
		c := mustParse(t, src)
		if c.TLS != nil {
			c.TLS.Sum[0] = sum
		}
		if pt := c.Pools[0].TLS; pt != nil {
			pt.Sum[0] = sum
		}
		return c
	}
	off := parse(base, 0)
	on := parse(base+"    tls: {ca: ca.pem}\ntls: {cert: a.pem, key: a.key}\n", 1)
	rotated := parse(base+"    tls: {ca: ca.pem}\ntls: {cert: a.pem, key: a.key}\n", 2)
	moved := parse(base+"    tls: {ca: ca2.pem, server_name: mc}\ntls: {cert: b.pem, key: a.key, client_ca: c.pem}\n", 2)
	tests := []struct {
		name                string
		started, prev, next *Config
		want                []string
	}{
		{"turned on", off, off, on, []string{
			"tls off → on (takes effect at the next restart)",
			"pool p: tls off → on",
		}},
		{"turned off", on, on, off, []string{
			"tls on → off (takes effect at the next restart)",
			"pool p: tls on → off",
		}},
		{"rotated", on, on, rotated, []string{
			"tls: files changed (new connections use them)",
			"pool p: tls: files changed (its servers reconnect with them)",
		}},
		{"other files", on, on, moved, []string{
			"tls.cert a.pem → b.pem",
			`tls.client_ca "" → c.pem`,
			"pool p: tls.ca ca.pem → ca2.pem",
			`pool p: tls.server_name "" → mc`,
		}},
		{"unchanged", on, on, parse(base+"    tls: {ca: ca.pem}\ntls: {cert: a.pem, key: a.key}\n", 1), nil},
		{"back on after a reload turned it off", on, off, rotated, []string{
			"tls: files changed (new connections use them)",
			"pool p: tls off → on",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := DiffSince(tt.started, tt.prev, tt.next); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("DiffSince =\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}
