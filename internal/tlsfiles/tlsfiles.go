// Package tlsfiles turns the PEM files a config names into a *tls.Config, reading them
// afresh at each call so that a reload picks up rotated certificates.
package tlsfiles

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
)

// Sum identifies what a Config was made from: the files' contents and the settings. Two
// calls with equal sums made equal configs; the zero Sum stands for no TLS.
type Sum [sha256.Size]byte

// FileError is a file that could not be used, and why.
type FileError struct {
	Path string
	Err  error
}

func (e *FileError) Error() string { return e.Path + ": " + e.Err.Error() }
func (e *FileError) Unwrap() error { return e.Err }

// maxFileBytes bounds what is read of one file: a certificate chain is a few kilobytes, and
// a path to something else (a log, a device) must fail rather than fill memory or block.
const maxFileBytes = 1 << 20

// Server returns the config of a TLS server that presents the certificate chain in certFile
// with the private key in keyFile (both PEM; they may be one file). With clientCAFile, it
// requires client certificates signed by one of that file's CAs (mutual TLS).
func Server(certFile, keyFile, clientCAFile string) (*tls.Config, Sum, error) {
	h := newSum("server")
	cert, err := keyPair(h, certFile, keyFile)
	if err != nil {
		return nil, Sum{}, err
	}
	c := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCAFile != "" {
		if c.ClientCAs, err = certPool(h, clientCAFile); err != nil {
			return nil, Sum{}, err
		}
		c.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return c, sum(h), nil
}

// Client returns the config of a TLS client that verifies servers against the CAs in
// caFile (the system's roots when ""), under serverName (when "", the dialer uses the host
// of the address it dials). With certFile and keyFile it presents that certificate.
func Client(caFile, certFile, keyFile, serverName string) (*tls.Config, Sum, error) {
	h := newSum("client")
	field(h, []byte(serverName))
	c := &tls.Config{ServerName: serverName, MinVersion: tls.VersionTLS12}
	var err error
	if caFile != "" {
		if c.RootCAs, err = certPool(h, caFile); err != nil {
			return nil, Sum{}, err
		}
	}
	if certFile != "" || keyFile != "" {
		cert, err := keyPair(h, certFile, keyFile)
		if err != nil {
			return nil, Sum{}, err
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, sum(h), nil
}

func keyPair(h hash.Hash, certFile, keyFile string) (tls.Certificate, error) {
	certPEM, err := read(h, certFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	keyPEM, err := read(h, keyFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		// The usual causes: no certificate in certFile, no key in keyFile, or a key that
		// is not the certificate's; the message says which, the path where.
		path := keyFile
		if !hasBlock(certPEM, "CERTIFICATE") {
			path = certFile
		}
		return tls.Certificate{}, &FileError{Path: path, Err: err}
	}
	return cert, nil
}

func certPool(h hash.Hash, file string) (*x509.CertPool, error) {
	data, err := read(h, file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, &FileError{Path: file, Err: errors.New("no PEM certificate found")}
	}
	return pool, nil
}

// read returns the contents of the regular file at path, adding them to h.
func read(h hash.Hash, path string) ([]byte, error) {
	if path == "" {
		return nil, &FileError{Path: `""`, Err: errors.New("no file given")}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, &FileError{Path: path, Err: unwrapPath(err)}
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, &FileError{Path: path, Err: unwrapPath(err)}
	}
	if !fi.Mode().IsRegular() {
		return nil, &FileError{Path: path, Err: fmt.Errorf("not a regular file (%s)", fi.Mode().Type())}
	}
	data, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, &FileError{Path: path, Err: unwrapPath(err)}
	}
	if len(data) > maxFileBytes {
		return nil, &FileError{Path: path, Err: fmt.Errorf("larger than %d bytes", maxFileBytes)}
	}
	field(h, data)
	return data, nil
}

// unwrapPath drops the path from an *os.PathError, which FileError names already.
func unwrapPath(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// hasBlock reports whether data holds a PEM block of type typ.
func hasBlock(data []byte, typ string) bool {
	for {
		var b *pem.Block
		if b, data = pem.Decode(data); b == nil {
			return false
		}
		if b.Type == typ {
			return true
		}
	}
}

func newSum(kind string) hash.Hash {
	h := sha256.New()
	field(h, []byte(kind))
	return h
}

// field adds b to h with its length first, so that no two sequences of fields collide.
func field(h hash.Hash, b []byte) {
	_ = binary.Write(h, binary.BigEndian, uint64(len(b)))
	h.Write(b)
}

func sum(h hash.Hash) Sum {
	var s Sum
	h.Sum(s[:0])
	return s
}
