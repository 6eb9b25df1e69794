package burst

import "testing"

// TestGuess: one request or answer a read never reads again; a burst does while that finds
// bytes, and after it found none only every probeEvery-th burst, until a probe finds some.
func TestGuess(t *testing.T) {
	var g Guess
	if g.ReadAgain(1) || g.ReadAgain(0) {
		t.Fatal("read again after a lone request")
	}
	if !g.ReadAgain(2) {
		t.Fatal("the zero Guess does not read again after a burst")
	}
	g.Found(true)
	if !g.ReadAgain(5) {
		t.Fatal("no read again after one that found bytes")
	}
	g.Found(false)
	var tries []int
	for i := 1; i <= 3*probeEvery; i++ {
		if g.ReadAgain(2) {
			tries = append(tries, i)
			g.Found(false)
		}
	}
	if len(tries) != 3 || tries[0] != probeEvery || tries[1] != 2*probeEvery {
		t.Fatalf("after misses, bursts %v read again; want every %dth", tries, probeEvery)
	}
	for !g.ReadAgain(2) {
	}
	g.Found(true)
	if !g.ReadAgain(2) || !g.ReadAgain(3) {
		t.Fatal("a probe that found bytes did not restore reading again")
	}
}
