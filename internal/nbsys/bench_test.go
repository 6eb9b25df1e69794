package nbsys

import (
	"errors"
	"net"
	"syscall"
	"testing"
)

// BenchmarkWrite writes 4 KiB at a time to a loopback TCP connection whose other end a
// goroutine drains, as moxi writes a pipeline's requests to memcached: through
// syscall.Write, which tells the scheduler, and through Write, which does not.
//
//	go test -run - -bench Write ./internal/nbsys/
func BenchmarkWrite(b *testing.B) {
	for _, bc := range []struct {
		name  string
		write func(fd uintptr, p []byte) (int, error)
	}{
		{"syscall", func(fd uintptr, p []byte) (int, error) { return syscall.Write(int(fd), p) }},
		{"nbsys", Write},
	} {
		b.Run(bc.name, func(b *testing.B) {
			raw, done := drained(b)
			defer done()
			p := make([]byte, 4096)
			b.SetBytes(int64(len(p)))
			b.ReportAllocs()
			var err error
			fn := func(fd uintptr) bool {
				_, err = bc.write(fd, p)
				return !errors.Is(err, syscall.EAGAIN) // wait for room, as conn.write does
			}
			for b.Loop() {
				if werr := raw.Write(fn); werr != nil || err != nil {
					b.Fatal(werr, err)
				}
			}
		})
	}
}

// drained is the sending end of a loopback TCP connection whose receiving end a goroutine
// reads until done closes both.
func drained(b *testing.B) (syscall.RawConn, func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	out, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	in, err := ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		buf := make([]byte, 64<<10)
		for {
			if _, err := in.Read(buf); err != nil {
				return
			}
		}
	}()
	raw, err := out.(*net.TCPConn).SyscallConn()
	if err != nil {
		b.Fatal(err)
	}
	return raw, func() { out.Close(); in.Close(); <-read }
}
