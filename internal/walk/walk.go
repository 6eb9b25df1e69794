// Package walk marks the documented steps of the request path (docs/architecture.md) so
// that a test can check the page against what a request really passes. Built normally,
// Step does nothing and costs nothing; built with the walkprobe tag, it records its
// caller (see probe.go).
package walk
