//go:build !linux

package nbsys

import "syscall"

// Read is syscall.Read: elsewhere than Linux the scheduler is told.
func Read(fd uintptr, b []byte) (int, error) { return syscall.Read(int(fd), b) }

// Write is syscall.Write: elsewhere than Linux the scheduler is told.
func Write(fd uintptr, b []byte) (int, error) { return syscall.Write(int(fd), b) }
