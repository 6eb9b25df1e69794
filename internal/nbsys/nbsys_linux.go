package nbsys

import (
	"syscall"
	"unsafe"
)

// Read is read(2) on fd, a non-blocking descriptor: n is -1 when err is not nil, as with
// syscall.Read.
func Read(fd uintptr, b []byte) (n int, err error) {
	return raw(syscall.SYS_READ, fd, b)
}

// Write is write(2) on fd, a non-blocking descriptor: n is -1 when err is not nil, as with
// syscall.Write.
func Write(fd uintptr, b []byte) (n int, err error) {
	if len(b) > MaxRaw {
		return syscall.Write(int(fd), b)
	}
	return raw(syscall.SYS_WRITE, fd, b)
}

func raw(trap, fd uintptr, b []byte) (int, error) {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	r, _, errno := syscall.RawSyscall(trap, fd, uintptr(p), uintptr(len(b)))
	if errno != 0 {
		return -1, errno
	}
	return int(r), nil
}
