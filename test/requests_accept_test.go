//go:build accept

package test

import (
	"testing"
	"time"
)

// TestAcceptRequestsLog: GET /requests's figures through moxi without the race detector,
// at about 20,000 requests/s (the rate reached is logged): slow=5ms shows every delayed
// request and matches moxi's own count, sample=0.01 is within 10 % of 1 %, and 4 watchers
// that never read leave the load's p99 and CPU per request within noise.
func TestAcceptRequestsLog(t *testing.T) {
	checkRequestsLog(t, fastMoxi(t), 64, 5*time.Second, 0.1, true)
}
