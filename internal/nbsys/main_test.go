package nbsys

import (
	"testing"

	"go.uber.org/goleak"
)

// The benchmarks' readers must be gone when they end.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
