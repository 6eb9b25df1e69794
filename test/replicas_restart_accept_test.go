//go:build accept

package test

import (
	"testing"
	"time"
)

// TestAcceptReplicasRestart is the figure: 4 clients × 50 keys of each command × 50
// rounds, the victim restarted empty after being marked dead, and at once.
func TestAcceptReplicasRestart(t *testing.T) {
	t.Run("marked dead", func(t *testing.T) {
		restartRun{clients: 4, keys: 50, rounds: 50, hold: 1500 * time.Millisecond}.test(t)
	})
	t.Run("fast", func(t *testing.T) {
		restartRun{clients: 4, keys: 50, rounds: 50}.test(t)
	})
}
