// Package tlstest makes throwaway certificate authorities and certificates, written as PEM
// files, for tests of TLS on loopback.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority whose certificate is in CertFile.
type CA struct {
	CertFile string
	Cert     *x509.Certificate
	key      *ecdsa.PrivateKey
}

// Pair is a certificate signed by a CA, for 127.0.0.1, ::1 and localhost, usable by
// servers and clients alike, and its key.
type Pair struct {
	CertFile, KeyFile string
	Cert              *x509.Certificate
}

// NewCA makes a CA named name and writes its certificate to dir/name.crt.
func NewCA(t testing.TB, dir, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, cert := create(t, tmpl, tmpl, key, key)
	ca := &CA{CertFile: filepath.Join(dir, name+".crt"), Cert: cert, key: key}
	writePEM(t, ca.CertFile, "CERTIFICATE", der)
	return ca
}

// Issue makes a certificate named name signed by ca and writes it and its key to
// dir/name.crt and dir/name.key, replacing files already there.
func (ca *CA) Issue(t testing.TB, dir, name string) Pair {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, cert := create(t, tmpl, ca.Cert, key, ca.key)
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	p := Pair{CertFile: filepath.Join(dir, name+".crt"), KeyFile: filepath.Join(dir, name+".key"), Cert: cert}
	writePEM(t, p.CertFile, "CERTIFICATE", der)
	writePEM(t, p.KeyFile, "EC PRIVATE KEY", keyDER)
	return p
}

// BadFiles names two files no certificate can be read from, in dir: one missing, and one
// that is not PEM.
func BadFiles(t testing.TB, dir string) (missing, junk string) {
	t.Helper()
	missing, junk = filepath.Join(dir, "missing.pem"), filepath.Join(dir, "junk.pem")
	if err := os.WriteFile(junk, []byte("not pem\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return missing, junk
}

// Pool is a pool holding ca's certificate, for a client's RootCAs or a server's ClientCAs.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Certificate loads p for a tls.Config.
func (p Pair) Certificate(t testing.TB) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(p.CertFile, p.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// create makes the certificate tmpl for key, signed by parent's signer, and returns it
// encoded and parsed.
func create(t testing.TB, tmpl, parent *x509.Certificate, key, signer *ecdsa.PrivateKey) ([]byte, *x509.Certificate) {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return der, cert
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// writePEM writes the file whole under a temporary name and renames it into place, as a
// deployment rotating certificates does, so that a reader never sees half of it.
func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}
