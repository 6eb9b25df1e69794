package tlsfiles

import (
	"crypto/tls"
	"errors"
	"strings"
	"testing"

	"github.com/moxi-proxy/moxi/internal/tlstest"
)

func TestServerAndClient(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	srv := ca.Issue(t, dir, "server")
	cli := ca.Issue(t, dir, "client")

	sc, ssum, err := Server(srv.CertFile, srv.KeyFile, ca.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	if sc.ClientAuth != tls.RequireAndVerifyClientCert || sc.ClientCAs == nil || len(sc.Certificates) != 1 {
		t.Errorf("server config = %+v", sc)
	}
	cc, csum, err := Client(ca.CertFile, cli.CertFile, cli.KeyFile, "")
	if err != nil {
		t.Fatal(err)
	}
	if cc.RootCAs == nil || len(cc.Certificates) != 1 || cc.ServerName != "" {
		t.Errorf("client config = %+v", cc)
	}
	if ssum == (Sum{}) || csum == (Sum{}) || ssum == csum {
		t.Errorf("sums %x %x", ssum, csum)
	}

	// The two configs talk to each other, client certificate verified.
	ln, err := tls.Listen("tcp", "127.0.0.1:0", sc)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			err = c.(*tls.Conn).Handshake()
			c.Close()
		}
		done <- err
	}()
	c, err := tls.Dial("tcp", ln.Addr().String(), cc)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Same files, same sum; a rotated certificate, another.
	if _, again, _ := Server(srv.CertFile, srv.KeyFile, ca.CertFile); again != ssum {
		t.Error("same files gave another sum")
	}
	ca.Issue(t, dir, "server")
	if _, rotated, _ := Server(srv.CertFile, srv.KeyFile, ca.CertFile); rotated == ssum {
		t.Error("a rotated certificate gave the same sum")
	}
	if _, named, _ := Client(ca.CertFile, cli.CertFile, cli.KeyFile, "mc.example"); named == csum {
		t.Error("server_name is not in the sum")
	}
}

func TestSystemRoots(t *testing.T) {
	c, sum, err := Client("", "", "", "")
	if err != nil || c.RootCAs != nil || c.Certificates != nil || sum == (Sum{}) {
		t.Errorf("Client with no files = %+v, %x, %v", c, sum, err)
	}
}

// TestErrorsNameTheFile: each failure is a *FileError naming the file at fault.
func TestErrorsNameTheFile(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	a := ca.Issue(t, dir, "a")
	b := ca.Issue(t, dir, "b")
	missing, junk := tlstest.BadFiles(t, dir)
	tests := []struct {
		name string
		load func() error
		file string
		msg  string
	}{
		{"missing cert", func() error { _, _, err := Server(missing, a.KeyFile, ""); return err }, missing, "no such file"},
		{"missing key", func() error { _, _, err := Server(a.CertFile, missing, ""); return err }, missing, "no such file"},
		{"cert not PEM", func() error { _, _, err := Server(junk, a.KeyFile, ""); return err }, junk, "PEM"},
		{"key not PEM", func() error { _, _, err := Server(a.CertFile, junk, ""); return err }, junk, "PEM"},
		{"key of another cert", func() error { _, _, err := Server(a.CertFile, b.KeyFile, ""); return err }, b.KeyFile, "does not match"},
		{"client CA not PEM", func() error { _, _, err := Server(a.CertFile, a.KeyFile, junk); return err }, junk, "no PEM certificate"},
		{"CA missing", func() error { _, _, err := Client(missing, "", "", ""); return err }, missing, "no such file"},
		{"directory", func() error { _, _, err := Client(dir, "", "", ""); return err }, dir, "not a regular file"},
		{"client key without cert", func() error { _, _, err := Client("", "", a.KeyFile, ""); return err }, `""`, "no file given"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.load()
			var fe *FileError
			if !errors.As(err, &fe) || fe.Path != tt.file || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %v, want a FileError for %s saying %q", err, tt.file, tt.msg)
			}
		})
	}
}
