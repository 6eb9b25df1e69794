package nbsys

import (
	"bytes"
	"errors"
	"syscall"
	"testing"
)

// pair is a connected pair of non-blocking stream sockets, closed at the test's end.
func pair(t *testing.T) (a, b uintptr) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		if err := syscall.SetNonblock(fd, true); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { syscall.Close(fd) })
	}
	return uintptr(fds[0]), uintptr(fds[1])
}

func TestReadWrite(t *testing.T) {
	for _, size := range []int{0, 1, 4096, MaxRaw, MaxRaw + 1} {
		a, b := pair(t)
		if err := syscall.SetsockoptInt(int(a), syscall.SOL_SOCKET, syscall.SO_SNDBUF, 4<<20); err != nil {
			t.Fatal(err)
		}
		want := bytes.Repeat([]byte("moxi"), size/4+1)[:size]
		n, err := Write(a, want)
		if err != nil || n <= 0 && size > 0 {
			t.Fatalf("%d bytes: Write = %d, %v", size, n, err)
		}
		got := make([]byte, 0, size)
		buf := make([]byte, 64<<10)
		for len(got) < n {
			m, err := Read(b, buf)
			if err != nil {
				t.Fatalf("%d bytes: Read after %d: %d, %v", size, len(got), m, err)
			}
			got = append(got, buf[:m]...)
		}
		if !bytes.Equal(got, want[:n]) {
			t.Fatalf("%d bytes: read back %d bytes that differ from those written", size, len(got))
		}
	}
}

// TestErrors: an empty socket's read fails with EAGAIN and n = -1, as syscall.Read's, and a
// closed descriptor's with EBADF.
func TestErrors(t *testing.T) {
	_, b := pair(t)
	if n, err := Read(b, make([]byte, 16)); n != -1 || !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("Read of an empty socket = %d, %v; want -1, EAGAIN", n, err)
	}
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	syscall.Close(fds[0])
	syscall.Close(fds[1])
	if n, err := Write(uintptr(fds[0]), []byte("x")); n != -1 || !errors.Is(err, syscall.EBADF) {
		t.Fatalf("Write to a closed descriptor = %d, %v; want -1, EBADF", n, err)
	}
}
