package test

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/tlstest"
)

// tlsMemcached is a memcached that speaks TLS only, presenting pair; extra options
// (ssl_verify_mode, ssl_ca_cert) are appended to its -o list.
func tlsMemcached(t testing.TB, pair tlstest.Pair, extra ...string) *memcachedtest.Server {
	t.Helper()
	opts := append([]string{"ssl_chain_cert=" + pair.CertFile, "ssl_key=" + pair.KeyFile}, extra...)
	return memcachedtest.Start(t, "-Z", "-o", strings.Join(opts, ","))
}

// tlsClient is a client connection to a TLS server, its handshake done.
type tlsClient struct {
	*tls.Conn
	r *bufio.Reader
}

// dialTLS connects to addr trusting roots and presenting certs, and completes the handshake.
func dialTLS(addr string, roots *x509.CertPool, certs ...tls.Certificate) (*tlsClient, error) {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: &tls.Config{RootCAs: roots, Certificates: certs}}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	c := nc.(*tls.Conn)
	return &tlsClient{Conn: c, r: bufio.NewReader(c)}, nil
}

func mustDialTLS(t testing.TB, addr string, roots *x509.CertPool, certs ...tls.Certificate) *tlsClient {
	t.Helper()
	c, err := dialTLS(addr, roots, certs...)
	if err != nil {
		t.Fatalf("TLS dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// serial is the serial number of the certificate the server presented.
func (c *tlsClient) serial() string {
	return c.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// checkText sets keys with prefix over c's text protocol and reads them back, one and
// several at a time.
func checkText(t *testing.T, c net.Conn, r *bufio.Reader, prefix string) {
	t.Helper()
	var get strings.Builder
	var want []string
	for i := range 5 {
		k, v := fmt.Sprintf("%s%d", prefix, i), fmt.Sprintf("value-%s-%d", prefix, i)
		if got := roundTrip(t, c, r, fmt.Sprintf("set %s %d 0 %d\r\n%s\r\n", k, i, len(v), v), "STORED"); got[len(got)-1] != "STORED" {
			t.Fatalf("set %s: %q", k, got)
		}
		fmt.Fprintf(&get, " %s", k)
		want = append(want, fmt.Sprintf("VALUE %s %d %d", k, i, len(v)), v)
	}
	if got := roundTrip(t, c, r, "get "+prefix+"0\r\n", "END"); strings.Join(got, "|") != strings.Join(append(want[:2:2], "END"), "|") {
		t.Errorf("get %s0: %q", prefix, got)
	}
	if got := roundTrip(t, c, r, "get"+get.String()+" "+prefix+"missing\r\n", "END"); strings.Join(got, "|") != strings.Join(append(want, "END"), "|") {
		t.Errorf("multi-get: %q, want %q", got, append(want, "END"))
	}
}

// checkPipeline sends 300 sets and gets in one write and checks every answer, in order.
func checkPipeline(t *testing.T, c net.Conn, r *bufio.Reader, prefix string) {
	t.Helper()
	const n = 300
	var req, want strings.Builder
	for i := range n {
		k, v := fmt.Sprintf("%s%d", prefix, i), strings.Repeat(string(rune('a'+i%26)), i)
		fmt.Fprintf(&req, "set %s 0 0 %d\r\n%s\r\nget %s\r\n", k, len(v), v, k)
		fmt.Fprintf(&want, "STORED\r\nVALUE %s 0 %d\r\n%s\r\nEND\r\n", k, len(v), v)
	}
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	go c.Write([]byte(req.String())) // the answers may fill the socket before the requests are all sent
	got := make([]byte, want.Len())
	if _, err := io.ReadFull(r, got); err != nil || string(got) != want.String() {
		t.Errorf("pipeline of %d sets and gets: %v; answers differ at byte %d", n, err, mismatch(string(got), want.String()))
	}
}

// mismatch is the index of the first byte where a and b differ.
func mismatch(a, b string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// binaryExchange sends reqs and a noop over c's binary protocol and returns every answer up
// to the noop's, each as "status key=value".
func binaryExchange(t *testing.T, c net.Conn, r *bufio.Reader, reqs ...*protocol.Request) []string {
	t.Helper()
	var wire []byte
	for i, req := range reqs {
		req.Opaque = uint32(i + 1)
		wire = protocol.AppendBinaryRequest(wire, req)
	}
	wire = protocol.AppendBinaryRequest(wire, &protocol.Request{Op: protocol.OpNoop, Opaque: 0xffff})
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(wire); err != nil {
		t.Fatal(err)
	}
	var out []string
	for {
		var h protocol.BinaryResponseHeader
		var resp protocol.Response
		if err := protocol.ReadBinaryResponse(r, protocol.DefaultLimits(), &h, &resp); err != nil {
			t.Fatalf("binary answer after %q: %v", out, err)
		}
		if h.Opaque == 0xffff {
			return out
		}
		out = append(out, fmt.Sprintf("%d %s=%s", h.Status, resp.Key, resp.Value))
	}
}

// checkBinary sets keys with prefix over c's binary protocol and reads them back, one by
// one and as a quiet batch.
func checkBinary(t *testing.T, c net.Conn, r *bufio.Reader, prefix string) {
	t.Helper()
	var sets, gets []*protocol.Request
	var want []string
	for i := range 4 {
		k, v := fmt.Sprintf("%s%d", prefix, i), fmt.Sprintf("bin-%s-%d", prefix, i)
		sets = append(sets, &protocol.Request{Op: protocol.OpSet, Key: []byte(k), Value: []byte(v)})
		gets = append(gets, &protocol.Request{Op: protocol.OpGet, Keys: [][]byte{[]byte(k)}, Quiet: true, WithKey: true})
		want = append(want, "0 "+k+"="+v)
	}
	for _, set := range sets { // one at a time: see TestTLS on memcached's TLS and pipelines
		if got := binaryExchange(t, c, r, set); strings.Join(got, "|") != "0 =" {
			t.Fatalf("binary set %s: %q", set.Key, got)
		}
	}
	one := binaryExchange(t, c, r, &protocol.Request{Op: protocol.OpGet, Keys: [][]byte{[]byte(prefix + "0")}, WithKey: true})
	if len(one) != 1 || one[0] != want[0] {
		t.Errorf("binary getk: %q, want %q", one, want[:1])
	}
	gets = append(gets, &protocol.Request{Op: protocol.OpGet, Keys: [][]byte{[]byte(prefix + "missing")}, Quiet: true, WithKey: true})
	if got := binaryExchange(t, c, r, gets...); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("binary getkq batch: %q, want %q", got, want)
	}
}

// TestTLS: a client that trusts the test CA works through moxi, in text and binary, to
// TLS-only memcached servers (one of them demanding moxi's client certificate); a client
// that does not trust it fails the handshake. A migration reads its old server over the
// pool's TLS too.
//
// Writes to the servers go one at a time: memcached 1.6.18 over TLS stalls on a pipeline
// of sets arriving in one TLS record (it leaves decrypted bytes in OpenSSL's buffer and
// waits for the socket), even straight from a client, until more bytes arrive; through
// moxi that is a request timeout. Pipelines over TLS are checked on the client's hop
// (TestTLSClientCA).
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	moxiCert := ca.Issue(t, dir, "moxi")
	mcCert := ca.Issue(t, dir, "memcached")
	proxyClient := ca.Issue(t, dir, "proxy-client")
	mcs := []*memcachedtest.Server{
		tlsMemcached(t, mcCert),
		tlsMemcached(t, mcCert, "ssl_verify_mode=2", "ssl_ca_cert="+ca.CertFile),
	}
	cfg := fmt.Sprintf(`watch_config: false
tls:
  cert: %s
  key: %s
pools:
  main:
    timeout: 2s
    servers: [%q, %q]
    tls:
      ca: %s
      cert: %s
      key: %s
`, moxiCert.CertFile, moxiCert.KeyFile, mcs[0].Addr, mcs[1].Addr, ca.CertFile, proxyClient.CertFile, proxyClient.KeyFile)
	moxi := startMoxi(t, "--config", writeConfig(t, cfg))

	c := mustDialTLS(t, moxi.addr, ca.Pool())
	if got := c.serial(); got != moxiCert.Cert.SerialNumber.String() {
		t.Errorf("moxi presented serial %s, want %s", got, moxiCert.Cert.SerialNumber)
	}
	checkText(t, c, c.r, "tls:text:")
	b := mustDialTLS(t, moxi.addr, ca.Pool())
	checkBinary(t, b, b.r, "tls:bin:")
	// Every server was reached (over TLS: they speak nothing else).
	if got := roundTrip(t, c, c.r, "stats proxy\r\n", "END"); strings.Count(strings.Join(got, "\n"), "state up") < 2 {
		t.Errorf("stats proxy: %q", got)
	}

	// A server that restarts is found alive again by the health probe, over TLS too.
	mcs[1].Stop()
	for i := range 4 { // its connections break; requests for its keys fail until it is dead
		roundTrip(t, c, c.r, fmt.Sprintf("get tls:text:%d\r\n", i), "END")
	}
	mcs[1].Restart(t)
	for deadline := time.Now().Add(20 * time.Second); ; {
		got := roundTrip(t, c, c.r, "stats proxy\r\n", "END")
		if strings.Count(strings.Join(got, "\n"), "state up") == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a restarted TLS server is not up again: %q", got)
		}
		<-time.After(20 * time.Millisecond) // the probe runs in moxi: poll for it
	}
	checkText(t, c, c.r, "tls:again:")

	other := tlstest.NewCA(t, dir, "other-ca")
	if c, err := dialTLS(moxi.addr, other.Pool()); err == nil {
		c.Close()
		t.Error("a client that does not trust moxi's CA completed the handshake")
	} else if !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("untrusted handshake failed with %v, want an unknown authority", err)
	}
	plain, err := dialText(moxi.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if ans, err := plain.call("version\r\n"); err == nil && strings.HasPrefix(ans, "VERSION") {
		t.Errorf("plaintext on a TLS listener answered %q", ans)
	}

	t.Run("migration reads the old server over TLS", func(t *testing.T) {
		oldMC, newMC := tlsMemcached(t, mcCert), tlsMemcached(t, mcCert)
		o := mustDialTLS(t, oldMC.Addr, ca.Pool())
		if got := roundTrip(t, o, o.r, "set mig:k 7 0 3\r\nold\r\n", "STORED"); got[0] != "STORED" {
			t.Fatalf("set on old: %q", got)
		}
		mcfg := fmt.Sprintf("watch_config: false\npools:\n  main:\n    timeout: 2s\n    servers:\n      - {addr: %q, migrate_from: %q}\n    tls: {ca: %s}\n",
			newMC.Addr, oldMC.Addr, ca.CertFile)
		m := startMoxi(t, "--config", writeConfig(t, mcfg))
		mc, err := dialText(m.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer mc.Close()
		if v, err := mc.get("mig:k"); err != nil || v != "old" {
			t.Errorf("get through a migration from a TLS server: %q %v\n%s", v, err, m.out.String())
		}
	})
}

// TestTLSClientCA: with client_ca, a client without a certificate is refused and one with
// a certificate the CA signed is served.
func TestTLSClientCA(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	clientCA := tlstest.NewCA(t, dir, "client-ca")
	moxiCert := ca.Issue(t, dir, "moxi")
	good := clientCA.Issue(t, dir, "good-client")
	stranger := ca.Issue(t, dir, "stranger") // signed, but not by client_ca
	cfg := fmt.Sprintf("watch_config: false\ntls: {cert: %s, key: %s, client_ca: %s}\npools: {main: {embedded: 1}}\n",
		moxiCert.CertFile, moxiCert.KeyFile, clientCA.CertFile)
	moxi := startMoxi(t, "--config", writeConfig(t, cfg))

	refused := func(name string, certs ...tls.Certificate) {
		c, err := dialTLS(moxi.addr, ca.Pool(), certs...)
		if err == nil {
			// TLS 1.3 finishes the client's side of the handshake before the server has
			// checked the client's certificate: the refusal arrives as the first read.
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_, err = c.Write([]byte("version\r\n"))
			if err == nil {
				var line string
				line, err = c.r.ReadString('\n')
				if err == nil {
					t.Errorf("%s: served: %q", name, line)
					return
				}
			}
		}
		if !strings.Contains(err.Error(), "certificate") {
			t.Errorf("%s: refused with %v, want a certificate error", name, err)
		}
	}
	refused("no certificate")
	refused("certificate of another CA", stranger.Certificate(t))

	c := mustDialTLS(t, moxi.addr, ca.Pool(), good.Certificate(t))
	checkText(t, c, c.r, "mtls:")
	checkPipeline(t, c, c.r, "mtls:pipe:")
	b := mustDialTLS(t, moxi.addr, ca.Pool(), good.Certificate(t))
	checkBinary(t, b, b.r, "mtls:bin:")
}

// TestTLSRotation: replaced certificate files are in service after a SIGHUP, and again
// after POST /reload, for new connections; a connection opened before keeps working with
// the certificate it got. A reload with a bad key file is refused and changes nothing.
func TestTLSRotation(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	first := ca.Issue(t, dir, "moxi")
	cfg := fmt.Sprintf("watch_config: false\ntls: {cert: %s, key: %s}\npools: {main: {embedded: 1}}\n", first.CertFile, first.KeyFile)
	admin := freeAddr(t)
	moxi := startMoxi(t, "--config", writeConfig(t, cfg), "--admin", admin)

	old := mustDialTLS(t, moxi.addr, ca.Pool())
	if got := roundTrip(t, old, old.r, "set rot:k 0 0 2\r\nv1\r\n", "STORED"); got[0] != "STORED" {
		t.Fatalf("set: %q", got)
	}
	// presented polls new connections until moxi presents want's certificate.
	presented := func(want tlstest.Pair) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			c, err := dialTLS(moxi.addr, ca.Pool())
			if err != nil {
				t.Fatal(err)
			}
			got := c.serial()
			c.Close()
			if got == want.Cert.SerialNumber.String() {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("new connections still get serial %s, want %s\n%s", got, want.Cert.SerialNumber, moxi.out.String())
			}
			<-time.After(20 * time.Millisecond) // the reload runs in another process: poll for it
		}
	}

	second := ca.Issue(t, dir, "moxi") // same files, new contents
	if err := moxi.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	presented(second)

	third := ca.Issue(t, dir, "moxi")
	code, body := postReload(t, admin)
	if code != http.StatusOK || !strings.Contains(body, "tls: files changed") {
		t.Errorf("POST /reload after a rotation: %d %q", code, body)
	}
	presented(third)

	// The connection from before both rotations still works, on its own certificate.
	if got := roundTrip(t, old, old.r, "get rot:k\r\n", "END"); strings.Join(got, "|") != "VALUE rot:k 0 2|v1|END" {
		t.Errorf("old connection after rotation: %q", got)
	}
	if got := old.serial(); got != first.Cert.SerialNumber.String() {
		t.Errorf("old connection's serial %s, want %s", got, first.Cert.SerialNumber)
	}

	if err := os.WriteFile(third.KeyFile, []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, body = postReload(t, admin)
	if code != http.StatusBadRequest || !strings.Contains(body, "tls.key: "+third.KeyFile) {
		t.Errorf("POST /reload with a bad key: %d %q, want 400 naming tls.key", code, body)
	}
	c := mustDialTLS(t, moxi.addr, ca.Pool())
	if got := c.serial(); got != third.Cert.SerialNumber.String() {
		t.Errorf("after a rejected reload moxi presents %s, want %s", got, third.Cert.SerialNumber)
	}
	if got := roundTrip(t, c, c.r, "get rot:k\r\n", "END"); len(got) != 3 {
		t.Errorf("get after a rejected reload: %q", got)
	}
}

// BenchmarkTLSGet is the cost of TLS: sequential get round trips of one 100-byte value from
// one client, straight to memcached and through moxi, with TLS on neither hop, on either or
// on both. It reports each setup's median and p99 round trip.
func BenchmarkTLSGet(b *testing.B) {
	dir := b.TempDir()
	ca := tlstest.NewCA(b, dir, "ca")
	cert := ca.Issue(b, dir, "server")
	bin := fastMoxi(b)
	plainMC, tlsMC := memcachedtest.Start(b), tlsMemcached(b, cert)
	startProxy := func(clientTLS bool, mc *memcachedtest.Server, serverTLS bool) string {
		cfg := fmt.Sprintf("watch_config: false\npools:\n  main:\n    servers: [%q]\n", mc.Addr)
		if serverTLS {
			cfg += "    tls: {ca: " + ca.CertFile + "}\n"
		}
		if clientTLS {
			cfg += "tls: {cert: " + cert.CertFile + ", key: " + cert.KeyFile + "}\n"
		}
		return startMoxiBin(b, bin, "--config", writeConfig(b, cfg)).addr
	}
	setups := []struct {
		name      string
		addr      string
		clientTLS bool
	}{
		{"memcached/plain", plainMC.Addr, false},
		{"memcached/tls", tlsMC.Addr, true},
		{"moxi/plain-plain", startProxy(false, plainMC, false), false},
		{"moxi/tls-plain", startProxy(true, plainMC, false), true},
		{"moxi/plain-tls", startProxy(false, tlsMC, true), false},
		{"moxi/tls-tls", startProxy(true, tlsMC, true), true},
	}
	value := strings.Repeat("v", 100)
	for _, s := range setups {
		b.Run(s.name, func(b *testing.B) {
			var nc net.Conn
			var err error
			if s.clientTLS {
				nc, err = tls.Dial("tcp", s.addr, &tls.Config{RootCAs: ca.Pool()})
			} else {
				nc, err = net.Dial("tcp", s.addr)
			}
			if err != nil {
				b.Fatal(err)
			}
			c := &textClient{c: nc, r: bufio.NewReader(nc)}
			defer c.Close()
			if ans, err := c.set("bench:tls", value); err != nil || ans != "STORED" {
				b.Fatalf("set: %q %v", ans, err)
			}
			lat := make([]time.Duration, 0, b.N)
			for b.Loop() {
				start := time.Now()
				if v, err := c.get("bench:tls"); err != nil || v != value {
					b.Fatalf("get: %q %v", v, err)
				}
				lat = append(lat, time.Since(start))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "ns-median")
			b.ReportMetric(float64(p99(lat).Nanoseconds()), "ns-p99")
		})
	}
}
