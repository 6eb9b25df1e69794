package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseUsers(t *testing.T) {
	users, bad := ParseUsers([]byte("# tenants\nalice:secret\n\nbob:pa:ss\r\n"))
	if bad != "" || len(users) != 2 || users["alice"] != "secret" || users["bob"] != "pa:ss" {
		t.Errorf("ParseUsers = %v, %q", users, bad)
	}
	for _, in := range []string{"alice\n", ":secret\n", "alice:\n", "al ice:secret\n"} {
		if _, bad := ParseUsers([]byte(in)); bad == "" || strings.Contains(bad, "secret") {
			t.Errorf("ParseUsers(%q): bad = %q, want a reason without the password", in, bad)
		}
	}
}

// TestLoadSecrets: the users file and the sasl password file are read at every load, a
// missing or empty one fails it, and Diff tells a change of either without its content.
func TestLoadSecrets(t *testing.T) {
	dir := t.TempDir()
	users, password := filepath.Join(dir, "users"), filepath.Join(dir, "password")
	write := func(path, data string) {
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	src := "pools:\n  p:\n    servers: [\"h:1\"]\n    sasl: {user: moxi, password_file: " + password + "}\nauth: {users_file: " + users + "}\n"
	load := func() (*Config, error) {
		c, err := Parse([]byte(src), "m.yaml")
		if err != nil {
			t.Fatal(err)
		}
		return c, c.LoadSecrets("m.yaml")
	}
	if _, err := load(); err == nil || !strings.Contains(err.Error(), "auth.users_file") {
		t.Errorf("missing users file: %v", err)
	}
	write(users, "alice:secret\n")
	if _, err := load(); err == nil || !strings.Contains(err.Error(), "pools.p.sasl.password_file") {
		t.Errorf("missing password file: %v", err)
	}
	write(password, " \n")
	if _, err := load(); err == nil || !strings.Contains(err.Error(), "is empty") {
		t.Errorf("empty password file: %v", err)
	}
	write(password, "hunter2\n")
	a, err := load()
	if err != nil {
		t.Fatal(err)
	}
	if a.Auth.Users["alice"] != "secret" || string(a.Pools[0].SASL.Password) != "hunter2" {
		t.Errorf("loaded %v and %q", a.Auth.Users, a.Pools[0].SASL.Password)
	}
	write(users, "alice:secret\nbob:builder\n")
	write(password, "hunter3\n")
	b, err := load()
	if err != nil {
		t.Fatal(err)
	}
	diff := strings.Join(Diff(a, b), "\n")
	for _, want := range []string{"auth.users_file: users changed", "pool p: sasl.password_file: password changed"} {
		if !strings.Contains(diff, want) {
			t.Errorf("Diff has no %q:\n%s", want, diff)
		}
	}
	if strings.Contains(diff, "hunter") || strings.Contains(diff, "builder") {
		t.Errorf("Diff shows a secret:\n%s", diff)
	}
	if y, _ := b.YAML(); strings.Contains(string(y), "hunter") || !strings.Contains(string(y), password) {
		t.Errorf("YAML:\n%s", y)
	}
}

func FuzzParseUsers(f *testing.F) {
	f.Add([]byte("alice:secret\n# x\nbob:pa:ss\r\n"))
	f.Add([]byte(":\n\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		users, bad := ParseUsers(data)
		if bad != "" {
			return
		}
		for u, p := range users {
			if u == "" || p == "" || strings.ContainsAny(u, ": \t\n") {
				t.Fatalf("ParseUsers(%q) took user %q with password %q", data, u, p)
			}
		}
	})
}

// TestReadReportsEverything: Read reports a file's bad values and the files it names that
// cannot be read in one error, in the order of the file's lines, as one run of --check must.
func TestReadReportsEverything(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	src := `admin_token_file: ` + missing + `/token
tls:
  cert: ` + missing + `/cert.pem
  key: ` + missing + `/key.pem
pools:
  p:
    timeout: fast
    servers: ["127.0.0.1:1"]
    sasl: {user: u, password_file: ` + missing + `/pw}
auth:
  users_file: ` + missing + `/users
`
	_, err := Read([]byte(src), "m.yaml")
	if err == nil {
		t.Fatal("Read of a config with five problems: no error")
	}
	lines := strings.Split(strings.TrimSpace(err.Error()), "\n")
	want := []string{"m.yaml:1: admin_token_file: ", "m.yaml:3: tls.cert: ", "m.yaml:7: pools.p.timeout: ", "m.yaml:9: pools.p.sasl.password_file: ", "m.yaml:11: auth.users_file: "}
	if len(lines) != len(want) {
		t.Fatalf("Read reported %d problems, want %d:\n%v", len(lines), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("problem %d: %q, want it to start %q", i+1, lines[i], w)
		}
	}
	if _, err := Parse([]byte(src), "m.yaml"); err == nil || strings.Count(err.Error(), "\n") != 0 {
		t.Errorf("Parse, which reads no other file: %v, want the bad timeout alone", err)
	}
}
