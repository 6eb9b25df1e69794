// Package burst decides, for a reader that serves what came on a socket inside its wait
// for the socket, whether to read again at once after a burst (several requests or answers
// in one read) or to wait for Go's poller to say the socket is readable. Waiting costs no
// read that finds nothing; reading finds the bytes of a peer that pipelines sooner than
// the poller, which a busy process asks less often, would tell of them. Which pays depends
// on the peer, so it is learnt: read again while that has found bytes, and after it found
// none only every probeEvery-th burst.
package burst

// probeEvery is how often, after a read at once found nothing, a burst tries again.
const probeEvery = 8

// Guess is one socket's. The zero value reads again after a burst.
type Guess struct {
	missed bool  // the last read at once found nothing
	skip   uint8 // since then, bursts still to wait for before one reads at once again
}

// ReadAgain reports whether to read again at once after n requests or answers came in
// one read; if so, Found is then told what that read found.
func (g *Guess) ReadAgain(n int) bool {
	switch {
	case n <= 1:
		return false
	case g.missed && g.skip > 0:
		g.skip--
		return false
	}
	return true
}

// Found records whether the read ReadAgain asked for found bytes.
func (g *Guess) Found(found bool) {
	g.missed = !found
	if !found {
		g.skip = probeEvery - 1
	}
}
