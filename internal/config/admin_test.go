package config

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAdminTokenFile: the file is read by LoadAdminToken, white space around the token
// dropped; a missing or empty file fails the load; YAML writes the key back.
func TestAdminTokenFile(t *testing.T) {
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("  s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	src := func(path string) string { return "admin_token_file: " + path + "\npools:\n  main: {embedded: 1}\n" }

	c := mustParse(t, src(token))
	if c.AdminTokenFile != token || c.AdminToken != nil {
		t.Fatalf("parsed admin_token_file = %q, token %q before LoadAdminToken", c.AdminTokenFile, c.AdminToken)
	}
	if err := c.LoadAdminToken("t.yaml"); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(c.AdminToken, []byte("s3cret")) {
		t.Errorf("AdminToken = %q, want s3cret", c.AdminToken)
	}
	out, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "admin_token_file: "+token+"\n") {
		t.Errorf("YAML lacks admin_token_file:\n%s", out)
	}
	for _, bad := range []struct{ path, want string }{
		{filepath.Join(dir, "missing"), "t.yaml:1: admin_token_file: open "},
		{empty, "t.yaml:1: admin_token_file: " + empty + " is empty"},
	} {
		c := mustParse(t, src(bad.path))
		if err := c.LoadAdminToken("t.yaml"); err == nil || !strings.HasPrefix(err.Error(), bad.want) {
			t.Errorf("LoadAdminToken of %s: %v, want %q…", bad.path, err, bad.want)
		}
	}
	if c := mustParse(t, src(`""`)); c.LoadAdminToken("t.yaml") != nil || c.AdminToken != nil {
		t.Errorf("no admin_token_file: token %q", c.AdminToken)
	}
}

// TestAllowFlushAll: on by default; off shows in stats settings as memcached -F does.
func TestAllowFlushAll(t *testing.T) {
	flushEnabled := func(c *Config) string {
		st, err := c.Settings()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range st {
			if s.Name == "flush_enabled" {
				return s.Value
			}
		}
		return ""
	}
	if c := Default(); !c.Limits.AllowFlushAll || flushEnabled(c) != "yes" {
		t.Errorf("default: allow_flush_all %v, flush_enabled %q", c.Limits.AllowFlushAll, flushEnabled(c))
	}
	c := mustParse(t, "limits:\n  allow_flush_all: false\npools:\n  main: {embedded: 1}\n")
	if c.Limits.AllowFlushAll || flushEnabled(c) != "no" {
		t.Errorf("allow_flush_all: false: %v, flush_enabled %q", c.Limits.AllowFlushAll, flushEnabled(c))
	}
}

// TestPeerTokenFile: hot_cache.peer_token_file is read by LoadPeerToken, and by Read with
// the other files, white space around the token dropped; a missing or empty file fails the
// load at the key's line; YAML writes the key back, never the token; no file, no token.
func TestPeerTokenFile(t *testing.T) {
	dir := t.TempDir()
	token := filepath.Join(dir, "peer-token")
	if err := os.WriteFile(token, []byte("\tp33r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	src := func(path string) string {
		return "pools:\n  main: {embedded: 1}\nhot_cache:\n  peers: [\"10.0.0.2:9151\"]\n  peer_token_file: " + path + "\n"
	}

	c := mustParse(t, src(token))
	if h := c.HotCache; h.PeerTokenFile != token || h.PeerTokenLine != 5 || h.PeerToken != nil {
		t.Fatalf("parsed peer_token_file = %q at line %d, token %q before LoadPeerToken", h.PeerTokenFile, h.PeerTokenLine, h.PeerToken)
	}
	if err := c.LoadPeerToken("t.yaml"); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(c.HotCache.PeerToken, []byte("p33r")) {
		t.Errorf("PeerToken = %q, want p33r", c.HotCache.PeerToken)
	}
	out, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "  peer_token_file: "+token+"\n") || strings.Contains(string(out), "p33r") {
		t.Errorf("YAML lacks peer_token_file, or shows the token:\n%s", out)
	}
	if r, err := Read([]byte(src(token)), "t.yaml"); err != nil || !bytes.Equal(r.HotCache.PeerToken, []byte("p33r")) {
		t.Errorf("Read: %v, token %q", err, r.HotCache.PeerToken)
	}
	for _, bad := range []struct{ path, want string }{
		{filepath.Join(dir, "missing"), "t.yaml:5: hot_cache.peer_token_file: open "},
		{empty, "t.yaml:5: hot_cache.peer_token_file: " + empty + " is empty: it must hold the token"},
	} {
		c := mustParse(t, src(bad.path))
		if err := c.LoadPeerToken("t.yaml"); err == nil || !strings.HasPrefix(err.Error(), bad.want) {
			t.Errorf("LoadPeerToken of %s: %v, want %q…", bad.path, err, bad.want)
		}
		if c.HotCache.PeerToken != nil {
			t.Errorf("LoadPeerToken of %s failed but set the token %q", bad.path, c.HotCache.PeerToken)
		}
		if _, err := Read([]byte(src(bad.path)), "t.yaml"); err == nil || !strings.HasPrefix(err.Error(), bad.want) {
			t.Errorf("Read with %s: %v, want %q…", bad.path, err, bad.want)
		}
	}
	if c := mustParse(t, "pools:\n  main: {embedded: 1}\n"); c.LoadPeerToken("t.yaml") != nil || c.HotCache.PeerToken != nil {
		t.Errorf("no peer_token_file: token %q", c.HotCache.PeerToken)
	}
}
