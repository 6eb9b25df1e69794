package backend

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/sockpeek"
	"github.com/moxi-proxy/moxi/internal/tlstest"
)

// TestDialTLS: a TLS connection from Dial verifies the server for the dialed host, lets
// sockpeek see bytes waiting under the TLS layer, and reports a write that timed out as a
// timeout that conn.write does not go on after.
func TestDialTLS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, dir, "ca")
	srv := ca.Issue(t, dir, "memcached")
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{srv.Certificate(t)}})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 2)
	go func() { // the two connections the test makes
		for range 2 {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			accepted <- c
		}
	}()

	if _, err := Dial(context.Background(), ln.Addr().String(), time.Second, &tls.Config{RootCAs: x509.NewCertPool()}); err == nil {
		t.Error("Dial trusted a server whose CA is not in the roots")
	}
	(<-accepted).Close() // the failed handshake's connection

	nc, err := Dial(context.Background(), ln.Addr().String(), 5*time.Second, &tls.Config{RootCAs: ca.Pool()})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	peer := <-accepted
	defer peer.Close()

	if sockpeek.Waiting(nc) {
		t.Error("bytes waiting before the server sent any")
	}
	if _, err := peer.Write([]byte("VERSION 1.6.18\r\n")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !sockpeek.Waiting(nc) {
		if time.Now().After(deadline) {
			t.Fatal("sockpeek never saw the server's bytes under TLS")
		}
		<-time.After(time.Millisecond)
	}

	// The server reads nothing: writes fill the socket buffers, then time out.
	_ = nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	big := make([]byte, 1<<20)
	for {
		_, err = nc.Write(big)
		if err != nil {
			break
		}
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("timed-out TLS write: %v, want a timeout that is not os.ErrDeadlineExceeded", err)
	}
}
