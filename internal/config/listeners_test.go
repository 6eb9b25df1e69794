package config

import (
	"testing"
)

// TestListeners: each listener's default pool (the config's when it gives none), its TLS
// taking the fields it leaves out from the top-level tls, and the mistakes reported at
// their line.
func TestListeners(t *testing.T) {
	const pools = "pools:\n  a: {embedded: 1}\n  b: {embedded: 1}\ndefault_pool: a\n"
	c := mustParse(t, pools+`tls: {cert: /c.crt, key: /c.key}
listeners:
  - listen: 127.0.0.1:22122
    default_pool: b
  - {listen: /run/moxi/b.sock, tls: {}}
  - {listen: ":22124", tls: {cert: /d.crt, key: /d.key, client_ca: /ca.crt}}
`)
	want := []Listener{
		{Listen: "127.0.0.1:22122", DefaultPool: "b"},
		{Listen: "/run/moxi/b.sock", DefaultPool: "a", TLS: &TLS{Cert: "/c.crt", Key: "/c.key"}},
		{Listen: ":22124", DefaultPool: "a", TLS: &TLS{Cert: "/d.crt", Key: "/d.key", ClientCA: "/ca.crt"}},
	}
	got := withoutLines(c).Listeners
	if len(got) != len(want) {
		t.Fatalf("listeners %+v, want %+v", got, want)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Listen != w.Listen || g.DefaultPool != w.DefaultPool || (g.TLS == nil) != (w.TLS == nil) ||
			g.TLS != nil && (g.TLS.Cert != w.TLS.Cert || g.TLS.Key != w.TLS.Key || g.TLS.ClientCA != w.TLS.ClientCA) {
			t.Errorf("listener %d: %+v (tls %+v), want %+v (tls %+v)", i, g, g.TLS, w, w.TLS)
		}
	}

	for _, tt := range []struct{ name, src, want string }{
		{"no such pool", pools + "listeners:\n  - {listen: \"127.0.0.1:1\", default_pool: c}\n",
			`m.yaml:6: listeners[0].default_pool: no pool named "c"`},
		{"no listen", pools + "listeners:\n  - {default_pool: b}\n",
			"m.yaml:6: listeners[0].listen: required: the address or Unix socket path of this port"},
		{"twice", pools + "listen: 127.0.0.1:1\nlisteners:\n  - {listen: \"127.0.0.1:1\"}\n",
			"m.yaml:7: listeners[0].listen: 127.0.0.1:1 is already listened on by listen"},
		{"twice among listeners", pools + "listeners:\n  - {listen: \"127.0.0.1:2\"}\n  - {listen: \"127.0.0.1:2\"}\n",
			"m.yaml:7: listeners[1].listen: 127.0.0.1:2 is already listened on by listeners[0]"},
		{"tls without a certificate", pools + "listeners:\n  - {listen: \"127.0.0.1:2\", tls: {}}\n",
			"m.yaml:6: listeners[0].tls.cert: required: the PEM file of the certificate chain moxi presents\n" +
				"m.yaml:6: listeners[0].tls.key: required: the PEM file of the certificate's private key"},
		{"not a list", pools + "listeners: {listen: x}\n",
			"m.yaml:5: listeners: want a list of {listen, default_pool, tls}, got a mapping"},
		{"bad address", pools + "listeners:\n  - {listen: \"nope\"}\n",
			`m.yaml:6: listeners[0].listen: bad address "nope": want host:port with a port from 0 to 65535, or the path of a Unix socket (/run/moxi/moxi.sock)`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte(tt.src), "m.yaml")
			if err == nil {
				t.Fatalf("Parse = %+v, want error %q", c, tt.want)
			}
			if got := err.Error(); got != tt.want {
				t.Errorf("error:\n%s\nwant:\n%s", got, tt.want)
			}
		})
	}
}

// TestListenersDiff: a listener's default pool changes at a reload; its address and TLS
// at the next restart.
func TestListenersDiff(t *testing.T) {
	const pools = "pools:\n  a: {embedded: 1}\n  b: {embedded: 1}\ndefault_pool: a\n"
	prev := mustParse(t, pools+"listeners: [{listen: \"127.0.0.1:2\"}]\n")
	next := mustParse(t, pools+"listeners: [{listen: \"127.0.0.1:2\", default_pool: b}, {listen: \"127.0.0.1:3\"}]\n")
	got := Diff(prev, next)
	want := []string{
		`listeners ["127.0.0.1:2"] → ["127.0.0.1:2", "127.0.0.1:3"]` + restartNote,
		"listeners 127.0.0.1:2: default_pool a → b",
	}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("Diff:\n%q\nwant:\n%q", got, want)
	}
}
