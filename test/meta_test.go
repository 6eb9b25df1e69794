package test

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"
)

// metaScript is a client's meta-protocol session, every request flag memcached 1.6 takes,
// pipelined in one write. What memcached answers to it is the expectation: the test does
// not write the answers down, it compares.
var metaScript = strings.Join([]string{
	"ms foo 2", "hi",
	"mg foo v",
	"mg foo s v f t h",
	"mg foo k v O123",
	"mg foo O9 k",
	"mg missing v",
	"mg missing v q",
	"mg missing k O77 q",
	"ms bar 3 F5 T0", "abc",
	"mg bar f v",
	"ms bar 3 MA", "xyz",
	"mg bar v",
	"ms bar 1 MP", "0",
	"mg bar v s",
	"ms newkey 1 MR", "x",
	"ms bar 1 ME", "x",
	"ms addme 1 ME", "x",
	"mg addme v",
	"mg bar c v",
	"ms bar 1 C99999", "z",
	"ms bar 1 I", "y",
	"md bar q",
	"mg bar v",
	"md bar",
	"md bar q",
	"ma cnt",
	"ma cnt N0 J10",
	"ma cnt v",
	"ma cnt MD D5 v",
	"ma cnt M- v t",
	"ma cnt q",
	"ma cnt MI D3 v",
	"mg cnt v",
	"ma foo",
	"ms Zm9vYg== 3 b", "b64",
	"mg foob v",
	"mg Zm9vYg== b k v",
	"md Zm9vYg== b q",
	"mg foob v",
	"ms plain 5", "plain",
	"mg cGxhaW4= b v k",
	"mn",
	"mg foo !",
	"mg foo v v",
	"mg " + strings.Repeat("k", 251) + " v",
	"mg " + strings.Repeat("k", 250) + " v",
	"mg viv N30 s v",
	"mg viv s v",
	"ms viv 3 T0", "new",
	"mg viv s v",
	"md foo I T30",
	"mg foo v",
	"mg foo v",
	"ms foo 2 T0", "ok",
	"mg foo v",
	"md foo x",
	"mg foo v f",
	"mg foo R30 v t",
	"ms q1 1 q", "a",
	"mg q1 v q",
	"mg q2 v q",
	"ms q3 1 q MR", "a",
	"mn",
	"mg foo u v",
	"mg foo T0 v t",
	"ms ttl 1 T1000", "t",
	"mg ttl E5 v",
	"ms cas1 1 E12345", "c",
	"mg cas1 c v",
	"ms cas1 1 C12345", "d",
	"ms foo abc", "xyz",
	"ms foo 2 Mz", "zz",
	"mg",
	"md",
	"ma",
	"me none",
	"me plain",
	"me cGxhaW4= b",
	"me Zm9vYg== b",
	"me !!!! b",
	"me",
	"mn",
}, "\r\n") + "\r\n"

// metaMasks hides what two correct servers may answer differently: cas values (every
// server counts its own), and me's seconds since the last access (a slow run may see 1).
var metaMasks = []*regexp.Regexp{regexp.MustCompile(`\bc[0-9]+\b`), regexp.MustCompile(`\b(cas|la)=[0-9]+\b`)}

// TestMetaDifferential: the meta script through moxi in front of three memcached, and
// through moxi's embedded store, answers byte for byte as one memcached answers it.
func TestMetaDifferential(t *testing.T) {
	want := metaExchange(t, startMemcachedAddr(t))
	servers := cluster(t, 3)
	cases := []struct {
		name string
		args []string
	}{
		{"three servers", []string{"--config", writeConfig(t, poolConfig("", addrs(servers)...))}},
		{"embedded", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			moxi := startMoxi(t, tc.args...)
			got := metaExchange(t, moxi.addr)
			compareLines(t, want, got)
		})
	}
}

// startMemcachedAddr starts one fresh memcached and returns its address.
func startMemcachedAddr(t *testing.T) string {
	return cluster(t, 1)[0].Addr
}

// metaExchange sends metaScript, then "version", and returns the answer lines before the
// version's, masked.
func metaExchange(t *testing.T, addr string) []string {
	t.Helper()
	return metaExchangeRaw(t, addr, metaScript)
}

// metaExchangeRaw sends script, then "version", and returns the answer lines before the
// version's, masked.
func metaExchangeRaw(t *testing.T, addr, script string) []string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(script + "version\r\n")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	var lines []string
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			t.Fatalf("%s: after %d lines: %v\n%s", addr, len(lines), err, strings.Join(lines, "\n"))
		}
		if bytes.HasPrefix(line, []byte("VERSION ")) {
			return lines
		}
		for _, m := range metaMasks {
			line = m.ReplaceAll(line, []byte("c?"))
		}
		lines = append(lines, string(line))
	}
}

func compareLines(t *testing.T, want, got []string) {
	t.Helper()
	if strings.Join(want, "") == strings.Join(got, "") {
		return
	}
	for i := 0; i < max(len(want), len(got)); i++ {
		var w, g string
		if i < len(want) {
			w = want[i]
		}
		if i < len(got) {
			g = got[i]
		}
		if w != g {
			t.Errorf("answer line %d: got %q, memcached answered %q", i, g, w)
		}
	}
	t.Logf("memcached:\n%s\nmoxi:\n%s", strings.Join(want, ""), strings.Join(got, ""))
}

// TestMetaMixedPipelineOrder: a client pipelines text and meta requests for the same keys
// in one write. moxi sends them on different connections to each server (binary and meta
// protocol), yet every read sees the write sent just before it, as on one memcached.
func TestMetaMixedPipelineOrder(t *testing.T) {
	servers := cluster(t, 3)
	moxi := startMoxi(t, "--config", writeConfig(t, poolConfig("", addrs(servers)...)))
	var script strings.Builder
	for i := range 200 {
		k := fmt.Sprintf("mix%d", i%7)
		switch i % 4 {
		case 0:
			fmt.Fprintf(&script, "set %s 0 0 %d\r\nt%d\r\nmg %s v\r\n", k, len(fmt.Sprint(i))+1, i, k)
		case 1:
			fmt.Fprintf(&script, "ms %s %d\r\nm%d\r\nget %s\r\n", k, len(fmt.Sprint(i))+1, i, k)
		case 2:
			fmt.Fprintf(&script, "ms %s %d q\r\nq%d\r\nmg %s v\r\nget %s\r\n", k, len(fmt.Sprint(i))+1, i, k, k)
		case 3:
			fmt.Fprintf(&script, "md %s q\r\nget %s\r\nmg %s v\r\n", k, k, k)
		}
	}
	want := metaExchangeRaw(t, startMemcachedAddr(t), script.String())
	got := metaExchangeRaw(t, moxi.addr, script.String())
	compareLines(t, want, got)
}
