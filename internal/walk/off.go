//go:build !walkprobe

package walk

// Step marks its caller as a step of the request path. Without the walkprobe tag it is
// empty, and inlined away.
func Step() {}
