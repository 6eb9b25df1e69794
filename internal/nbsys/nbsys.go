// Package nbsys reads and writes non-blocking sockets in system calls that do not tell Go's
// scheduler: a call on a non-blocking socket returns at once, so there is nothing to hand
// over while it runs.
//
// Go's syscall.Read and syscall.Write tell the scheduler a call begins and ends
// (entersyscall, exitsyscall) so that, should it block, the thread's processor (P) can run
// other goroutines. That costs what a proxy hop cannot spare: the monitor thread (sysmon),
// asleep while moxi was idle, is woken by the first such call after the idle spell and then
// looks at the processors every 20 µs; a call that lasts past one of its looks (a loopback
// write of a few KB does: the kernel delivers it to the receiver in the same call) has its
// processor taken and handed to another thread, which the call must win back when it
// returns. Pipelines of 100 sets through moxi, back to back on one connection, cost 99 µs
// of CPU each that way and 47 µs without (bench/pipeline).
//
// A write larger than MaxRaw does tell the scheduler: copying it into the socket may take
// long enough for the processor to be worth giving away.
package nbsys

import (
	"net"
	"syscall"
)

// MaxRaw is the largest write made without telling the scheduler.
const MaxRaw = 256 << 10

// Socket is the socket under nc, for the raw reads and writes; nil when nc offers none
// (syscall.Conn). Under TLS it is the TLS layer's own, if it offers one: callers that must
// not read or write records as bytes ask first whether nc is TLS.
func Socket(nc net.Conn) syscall.RawConn {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return raw
}
