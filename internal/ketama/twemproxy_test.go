package ketama_test

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/hashkit"
	"github.com/moxi-proxy/moxi/internal/ketama"
	"github.com/moxi-proxy/moxi/internal/pool"
)

// update regenerates the checked-in vectors (testdata/twemproxy_placement.txt here and
// ../hashkit/testdata/twemproxy_hashes.txt) from a live nutcracker instead of comparing.
var update = flag.Bool("update", false, "regenerate twemproxy vectors from a live nutcracker")

const (
	memcachedBin  = "/usr/bin/memcached"
	nutcrackerBin = "/usr/sbin/nutcracker"
)

// twemPool is one nutcracker pool: servers are twemproxy "host:port:weight [name]" specs.
type twemPool struct {
	dist, hash string
	servers    []string
	listen     string // filled in by startNutcracker
}

// TestTwemproxyLive writes 3,000 keys through a real nutcracker 0.5.0 for every hash
// function, with both ketama and modula, over four memcached servers with mixed weights
// and names, asks each memcached which keys it holds, and fails on any key moxi would
// place elsewhere.
func TestTwemproxyLive(t *testing.T) {
	if *update {
		generateVectors(t)
		return
	}
	mcs := startMemcached(t, "127.0.0.1", 4)
	servers := []string{mcs[0] + ":1", mcs[1] + ":2 alpha", mcs[2] + ":3", mcs[3] + ":1 beta"}
	var pools []*twemPool
	for _, dist := range []string{"ketama", "modula"} {
		for _, h := range hashkit.Names() {
			pools = append(pools, &twemPool{dist: dist, hash: h, servers: servers})
		}
	}
	startNutcracker(t, pools)
	keys := testKeys(3000)
	for i, p := range pools {
		got := placeThrough(t, p.listen, mcs, keys, fmt.Sprint(i))
		pick := picker(t, p)
		f, _ := hashkit.Lookup(p.hash)
		bad := 0
		for k, key := range keys {
			if want := pick(f([]byte(key))); got[k] != want {
				if bad < 5 {
					t.Errorf("%s/%s: key %q: nutcracker put it on server %d, moxi on %d", p.dist, p.hash, key, got[k], want)
				}
				bad++
			}
		}
		if bad > 0 {
			t.Errorf("%s/%s: %d of %d keys differ", p.dist, p.hash, bad, len(keys))
		}
	}
}

// picker builds moxi's placement for a twemproxy pool.
func picker(t *testing.T, p *twemPool) func(uint32) int {
	t.Helper()
	nodes := make([]ketama.Node, len(p.servers))
	for i, s := range p.servers {
		nodes[i] = parseServer(t, s)
	}
	switch p.dist {
	case "ketama":
		return ketama.New(nodes).Pick
	case "modula":
		return pool.NewModula(nodes).Pick
	}
	t.Fatalf("unknown distribution %q", p.dist)
	return nil
}

// parseServer reads a twemproxy server spec "host:port:weight [name]" into a Node.
func parseServer(t *testing.T, spec string) ketama.Node {
	t.Helper()
	addrWeight, name, named := strings.Cut(spec, " ")
	i := strings.LastIndexByte(addrWeight, ':')
	w, err := strconv.Atoi(addrWeight[i+1:])
	if i < 0 || err != nil {
		t.Fatalf("bad server spec %q", spec)
	}
	if !named {
		name = ketama.ServerName(addrWeight[:i])
	}
	return ketama.Node{Name: name, Weight: w}
}

// testKeys returns n distinct keys of varied length and shape, some with bytes ≥ 0x80 to
// exercise twemproxy's signed-char reads.
func testKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		switch i % 4 {
		case 0:
			keys[i] = "key:" + strconv.Itoa(i)
		case 1:
			keys[i] = fmt.Sprintf("user/%d/session-%x", i*7919, i*104729)
		case 2:
			keys[i] = strings.Repeat("x", i%37) + strconv.Itoa(i)
		default:
			keys[i] = fmt.Sprintf("h\xe9\xff%d\x80%c", i, 0x80+i%128)
		}
	}
	return keys
}

// freeAddrs returns n distinct loopback addresses whose ports were free a moment ago; the
// listeners stay open until all are chosen so the kernel cannot hand out a port twice.
func freeAddrs(t *testing.T, host string, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	for i := range addrs {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			t.Fatalf("find free port: %v", err)
		}
		defer l.Close()
		addrs[i] = l.Addr().String()
	}
	return addrs
}

// startMemcached starts n memcached processes on host and returns their addresses.
func startMemcached(t *testing.T, host string, n int) []string {
	t.Helper()
	addrs := freeAddrs(t, host, n)
	for _, a := range addrs {
		_, port, _ := net.SplitHostPort(a)
		startProcess(t, memcachedBin, "-u", "nobody", "-l", host, "-p", port, "-U", "0", "-m", "8")
	}
	for _, a := range addrs {
		waitListening(t, a)
	}
	return addrs
}

// startNutcracker runs nutcracker with one pool per entry of pools and fills in their
// listen addresses.
func startNutcracker(t *testing.T, pools []*twemPool) {
	t.Helper()
	dir := t.TempDir()
	var conf strings.Builder
	addrs := freeAddrs(t, "127.0.0.1", len(pools)+1)
	for i, p := range pools {
		p.listen = addrs[i]
		fmt.Fprintf(&conf, "p%d:\n  listen: %s\n  hash: %s\n  distribution: %s\n  timeout: 5000\n  auto_eject_hosts: false\n  servers:\n",
			i, p.listen, p.hash, p.dist)
		for _, s := range p.servers {
			fmt.Fprintf(&conf, "   - %s\n", s)
		}
	}
	confFile := filepath.Join(dir, "nutcracker.yml")
	if err := os.WriteFile(confFile, []byte(conf.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	_, stats, _ := net.SplitHostPort(addrs[len(pools)])
	startProcess(t, nutcrackerBin, "-c", confFile, "-s", stats, "-a", "127.0.0.1", "-o", filepath.Join(dir, "nutcracker.log"))
	for _, p := range pools {
		waitListening(t, p.listen)
	}
}

// startProcess starts bin and kills it when the test ends. A missing binary is a failure:
// the test environment installs memcached and nutcracker.
func startProcess(t *testing.T, bin string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("%s stderr: %s", bin, stderr.String())
		}
	})
}

// waitListening polls addr until it accepts a connection; the process behind it is
// external, so there is nothing to synchronise on but the socket.
func waitListening(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never started listening: %v", addr, err)
		}
		<-tick.C
	}
}

// placeThrough sets every key to tag through the proxy at proxyAddr, then returns for each
// key the index of the memcached in mcs holding it with that tag. The tag tells this
// round's copy from a stale one left by an earlier pool on another server.
func placeThrough(t *testing.T, proxyAddr string, mcs, keys []string, tag string) []int {
	t.Helper()
	c := dial(t, proxyAddr)
	defer c.Close()
	r := bufio.NewReader(c)
	const batch = 200
	for start := 0; start < len(keys); start += batch {
		end := min(start+batch, len(keys))
		var req bytes.Buffer
		for _, k := range keys[start:end] {
			fmt.Fprintf(&req, "set %s 0 0 %d\r\n%s\r\n", k, len(tag), tag)
		}
		if _, err := c.Write(req.Bytes()); err != nil {
			t.Fatalf("write to nutcracker: %v", err)
		}
		for _, k := range keys[start:end] {
			if line := readLine(t, r); line != "STORED" {
				t.Fatalf("set %q through nutcracker: %q", k, line)
			}
		}
	}
	owner := make([]int, len(keys))
	for i := range owner {
		owner[i] = -1
	}
	index := make(map[string]int, len(keys))
	for i, k := range keys {
		index[k] = i
	}
	for s, addr := range mcs {
		for key := range holding(t, addr, keys, tag) {
			i := index[key]
			if owner[i] >= 0 {
				t.Fatalf("key %q with tag %s on servers %d and %d", key, tag, owner[i], s)
			}
			owner[i] = s
		}
	}
	for i, o := range owner {
		if o < 0 {
			t.Fatalf("key %q set through nutcracker is on no server", keys[i])
		}
	}
	return owner
}

// holding returns the keys memcached at addr holds with value tag.
func holding(t *testing.T, addr string, keys []string, tag string) map[string]bool {
	t.Helper()
	c := dial(t, addr)
	defer c.Close()
	r := bufio.NewReader(c)
	held := make(map[string]bool)
	const batch = 100
	for start := 0; start < len(keys); start += batch {
		end := min(start+batch, len(keys))
		if _, err := fmt.Fprintf(c, "get %s\r\n", strings.Join(keys[start:end], " ")); err != nil {
			t.Fatalf("write to memcached: %v", err)
		}
		for {
			line := readLine(t, r)
			if line == "END" {
				break
			}
			f := strings.Fields(line)
			if len(f) != 4 || f[0] != "VALUE" {
				t.Fatalf("memcached %s answered %q", addr, line)
			}
			if value := readLine(t, r); value == tag {
				held[f[1]] = true
			}
		}
	}
	return held
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	c.SetDeadline(time.Now().Add(time.Minute))
	return c
}

func readLine(t *testing.T, r *bufio.Reader) string {
	t.Helper()
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return strings.TrimSuffix(line, "\r\n")
}

// TestTwemproxyLiveIPv6 checks the IPv6 form of ServerName against a real nutcracker.
// nutcracker reaches an IPv6 server only when it is written without brackets
// ("::1:PORT:1"), while moxi's config holds the bracketed "[::1]:PORT"; placing keys by
// ServerName of the bracketed form must match nutcracker's placement.
func TestTwemproxyLiveIPv6(t *testing.T) {
	l, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Fatalf("no IPv6 loopback (::1) to run nutcracker and memcached on: %v", err)
	}
	l.Close()
	mcs := startMemcached(t, "::1", 3)
	weights := []int{1, 2, 1}
	var specs []string
	nodes := make([]ketama.Node, len(mcs))
	for i, a := range mcs {
		host, port, _ := net.SplitHostPort(a)
		specs = append(specs, fmt.Sprintf("%s:%s:%d", host, port, weights[i]))
		nodes[i] = ketama.Node{Name: ketama.ServerName(a), Weight: weights[i]}
	}
	pools := []*twemPool{
		{dist: "ketama", hash: "md5", servers: specs},
		{dist: "ketama", hash: "fnv1a_64", servers: specs},
		{dist: "modula", hash: "md5", servers: specs},
	}
	startNutcracker(t, pools)
	keys := testKeys(2000)
	for i, p := range pools {
		got := placeThrough(t, p.listen, mcs, keys, "v6-"+fmt.Sprint(i))
		pick := ketama.New(nodes).Pick
		if p.dist == "modula" {
			pick = pool.NewModula(nodes).Pick
		}
		f, _ := hashkit.Lookup(p.hash)
		bad := 0
		for k, key := range keys {
			if pick(f([]byte(key))) != got[k] {
				bad++
			}
		}
		if bad > 0 {
			t.Errorf("%s/%s over %v: %d of %d keys placed elsewhere than nutcracker does", p.dist, p.hash, nodes, bad, len(keys))
		}
	}
}
