package servertest

import (
	"testing"

	"go.uber.org/goleak"
)

// Every server built here starts goroutines (connections, probes, copies); each must be
// gone once the server is closed.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
