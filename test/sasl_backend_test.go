package test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// The SASL user of the tests' memcached -S, alice's password, and one that is not: words
// found nowhere else in moxi's log.
const (
	saslPassword      = "alices-s3cret"
	wrongSASLPassword = "not-alices-s3cret"
)

// saslServers starts n memcached -S whose one user is alice, with saslPassword.
func saslServers(t *testing.T, n int) []*memcachedtest.Server {
	t.Helper()
	out := make([]*memcachedtest.Server, n)
	for i := range out {
		out[i] = memcachedtest.StartSASL(t, map[string]string{"alice": saslPassword})
	}
	return out
}

// saslPoolConfig is a config with one pool "main" over servers, authenticating as alice
// with the password in passwordFile; "" leaves the pool without a sasl section.
func saslPoolConfig(passwordFile string, servers []*memcachedtest.Server) string {
	extra := "    dead_backoff: 50ms\n    dead_backoff_max: 200ms\n"
	if passwordFile != "" {
		extra += fmt.Sprintf("    sasl: {user: alice, password_file: %q}\n", passwordFile)
	}
	return "watch_config: false\n" + poolConfig(extra, addrs(servers)...)
}

// writePassword writes password to the file at path.
func writePassword(t *testing.T, path, password string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// serverStatus is one server of GET /servers, as these tests read it.
type serverStatus struct{ Addr, State, Reason string }

// serverStatuses is GET /servers by server address.
func serverStatuses(t *testing.T, admin string) map[string]serverStatus {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/servers")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var servers []serverStatus
	if err := json.NewDecoder(resp.Body).Decode(&servers); err != nil {
		t.Fatal(err)
	}
	out := make(map[string]serverStatus, len(servers))
	for _, s := range servers {
		out[s.Addr] = s
	}
	return out
}

// allServers reports whether /servers shows every one of servers in state, with a reason
// that contains reason.
func allServers(t *testing.T, admin string, servers []*memcachedtest.Server, state, reason string) bool {
	t.Helper()
	got := serverStatuses(t, admin)
	for _, s := range servers {
		if st := got[s.Addr]; st.State != state || !strings.Contains(st.Reason, reason) {
			return false
		}
	}
	return true
}

// TestSASLBackend: moxi in front of two memcached -S, authenticating as the pool's sasl
// user, passes memccapable whole; a meta command, which such servers cannot take, is a
// client error.
func TestSASLBackend(t *testing.T) {
	t.Parallel() // mostly waits (timers, expiries, child tools): beside the other waiting tests
	mcs := saslServers(t, 2)
	password := filepath.Join(t.TempDir(), "password")
	writePassword(t, password, saslPassword)
	moxi := startMoxi(t, "--config", writeConfig(t, saslPoolConfig(password, mcs)))

	passed, failed := runMemccapable(t, moxi.addr)
	t.Logf("memccapable through moxi (memcached -S): %d passed, %d failed", len(passed), len(failed))
	if len(failed) > 0 || len(passed) != 54 {
		t.Errorf("memccapable: %d/54 passed; failed: %s\nmoxi log:\n%s", len(passed), strings.Join(failed, ", "), moxi.out.String())
	}

	c, r := dialConn(t, moxi.addr)
	got := roundTrip(t, c, r, "mg foo v\r\n", "EN")
	if len(got) != 1 || !strings.HasPrefix(got[0], "CLIENT_ERROR meta commands are not available on this pool") {
		t.Errorf("mg foo v answered %q, want CLIENT_ERROR: meta commands are not available", got)
	}
	if got := roundTrip(t, c, r, "set foo 0 0 1\r\nx\r\n", "STORED"); len(got) != 1 || got[0] != "STORED" {
		t.Errorf("set after the refused mg answered %q", got)
	}
	if strings.Contains(moxi.out.String(), saslPassword) {
		t.Errorf("the password is in moxi's log:\n%s", moxi.out.String())
	}
}

// TestSASLBackendWithoutCredentials: servers that require SASL behind a pool without a
// sasl section are marked dead as they refuse moxi's requests, and moxi says why, in its
// log and on /servers.
func TestSASLBackendWithoutCredentials(t *testing.T) {
	mcs := saslServers(t, 2)
	admin := freeAddr(t)
	moxi := startMoxi(t, "--config", writeConfig(t, saslPoolConfig("", mcs)), "--admin", admin)
	const reason = "the server requires SASL authentication (pools.main.sasl is not set)"
	c, r := dialConn(t, moxi.addr)
	n := 0
	eventually(t, "both servers dead with the reason on /servers", func() bool {
		n++ // keys that land on either server: the refusal comes with a request
		roundTrip(t, c, r, fmt.Sprintf("get k%d\r\n", n), "END")
		return allServers(t, admin, mcs, "dead", reason)
	})
	eventually(t, "the reason in moxi's log", func() bool {
		for _, mc := range mcs {
			if !slices.ContainsFunc(strings.Split(moxi.out.String(), "\n"), func(line string) bool {
				return strings.Contains(line, "level=WARN") && strings.Contains(line, mc.Addr) && strings.Contains(line, reason) // marked dead, or still dead
			}) {
				return false
			}
		}
		return true
	})
}

// TestSASLBackendPasswordReload: a reload that changes the password file's content makes
// the pool's servers connect again with it: a wrong password shows on /servers as the SASL
// failure, the right one serves again.
func TestSASLBackendPasswordReload(t *testing.T) {
	t.Parallel() // mostly waits for instants and polls: runs beside the other such tests
	mcs := saslServers(t, 2)
	password := filepath.Join(t.TempDir(), "password")
	writePassword(t, password, saslPassword)
	admin := freeAddr(t)
	moxi := startMoxi(t, "--config", writeConfig(t, saslPoolConfig(password, mcs)), "--admin", admin)
	c, r := dialConn(t, moxi.addr)
	served := func() bool {
		for i := range 20 { // keys on both servers
			k := fmt.Sprintf("k%d", i)
			if got := roundTrip(t, c, r, fmt.Sprintf("set %s 0 0 1\r\nx\r\n", k), "STORED"); len(got) != 1 || got[0] != "STORED" {
				return false
			}
			if got := roundTrip(t, c, r, "get "+k+"\r\n", "END"); len(got) != 3 || got[1] != "x" {
				return false
			}
		}
		return true
	}
	if !served() {
		t.Fatalf("not served with the right password\nmoxi log:\n%s", moxi.out.String())
	}

	writePassword(t, password, wrongSASLPassword)
	if code, body := postReload(t, admin); code != http.StatusOK {
		t.Fatalf("reload with a wrong password: %d %s", code, body)
	}
	eventually(t, "/servers shows the SASL failure", func() bool {
		return allServers(t, admin, mcs, "dead", "SASL authentication failed as user alice")
	})

	writePassword(t, password, saslPassword)
	if code, body := postReload(t, admin); code != http.StatusOK {
		t.Fatalf("reload with the right password: %d %s", code, body)
	}
	eventually(t, "servers up with the right password", func() bool { return allServers(t, admin, mcs, "up", "") })
	eventually(t, "served again", served)
	if strings.Contains(moxi.out.String(), saslPassword) { // the wrong one contains it
		t.Errorf("a password is in moxi's log:\n%s", moxi.out.String())
	}
}
