//go:build accept

package test

import (
	"testing"
	"time"
)

// TestAcceptReplicasRestart is the figure: 4 clients × 50 keys of each command × 50
// rounds, the victim restarted empty after being marked dead, and at once. Through moxi
// without the race detector (the figure's 200,000 round trips took 80 s each with it);
// TestReplicasRestart runs the same on the race build, smaller.
func TestAcceptReplicasRestart(t *testing.T) {
	t.Run("marked dead", func(t *testing.T) {
		restartRun{clients: 4, keys: 50, rounds: 50, hold: 1500 * time.Millisecond, bin: fastMoxi(t)}.test(t)
	})
	t.Run("fast", func(t *testing.T) {
		restartRun{clients: 4, keys: 50, rounds: 50, bin: fastMoxi(t)}.test(t)
	})
}
