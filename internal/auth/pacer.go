package auth

import (
	"hash/maphash"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
)

// Bounds of a Pacer's memory and of the waits it gives.
const (
	// MaxPaced is the most addresses and users a Pacer remembers: past it the one whose
	// last failure is oldest is forgotten. Each costs under 200 bytes (a fixed-size key,
	// never a user name, and the LRU's links): 2 MB at most.
	MaxPaced = 10_000
	// forgetAfter is how long an address or user is remembered after its last failure.
	forgetAfter = 10 * time.Minute
	// maxWait bounds the wait for one answer: failures that arrive together from one
	// address (parallel connections) are answered one Delay apart, up to this far ahead.
	maxWait = 30 * time.Second
)

// Pacer paces failed logins by the address they come from (its IP: a client's new
// connection is the same client; an IPv6 address by its /64, what one host is usually
// given) and by the user they name, whatever the connection: the failures in a row of
// an address or a user are answered as auth.Delay paces one connection's, each after the
// one before it. A client that reconnects after every few tries is so paced as if it had
// kept one connection, and one guessing a user's password from many addresses as well.
// Successful logins are never held back.
//
// Every address that is not IP (a Unix socket's) is one address. A Pacer is safe for
// concurrent use; the zero value is not: use NewPacer.
type Pacer struct {
	seed maphash.Seed // hashes user names: the map holds no name, whatever its length

	mu      sync.Mutex
	entries *simplelru.LRU[paceKey, *paceEntry] // guarded by mu
}

type paceKey struct {
	user bool       // a user's entry, else an address's
	addr netip.Addr // an address's
	hash uint64     // a user's: its name's hash
}

type paceEntry struct {
	failures int       // in a row, forgotten forgetAfter after the last
	last     time.Time // when the last failure arrived
	answer   time.Time // when the last failure is (or was) answered
}

// NewPacer makes an empty Pacer.
func NewPacer() *Pacer {
	entries, _ := simplelru.NewLRU[paceKey, *paceEntry](MaxPaced, nil) // the size is positive: no error
	return &Pacer{seed: maphash.MakeSeed(), entries: entries}
}

// Fail records a failed login from addr naming user, who is one of the users file's when
// known (else the address alone is paced: names that are no user's are as many as a
// client cares to make up), and returns how long to wait before answering it.
func (p *Pacer) Fail(addr net.Addr, user string, known bool) time.Duration {
	now := time.Now()
	keys := []paceKey{{addr: addressOf(addr)}}
	if known {
		keys = append(keys, paceKey{user: true, hash: maphash.String(p.seed, user)})
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var found [2]*paceEntry
	at := now
	for i, k := range keys {
		e, ok := p.entries.Get(k)
		if !ok || now.Sub(e.last) > forgetAfter && !e.answer.After(now) {
			e = &paceEntry{}
			p.entries.Add(k, e)
		}
		e.failures++
		e.last = now
		// Answered a Delay after the failure before it, or after this one when that
		// was answered already: one connection's pace, whatever the connections.
		from := now
		if e.answer.After(now) {
			from = e.answer
		}
		if next := from.Add(Delay(e.failures)); next.After(at) {
			at = next
		}
		found[i] = e
	}
	if limit := now.Add(maxWait); at.After(limit) {
		at = limit
	}
	for _, e := range found[:len(keys)] {
		e.answer = at
	}
	return at.Sub(now)
}

// Succeed forgets user's failures: the right password was given. The address's are kept:
// a client's own account does not buy it more guesses at others'.
func (p *Pacer) Succeed(user string) {
	k := paceKey{user: true, hash: maphash.String(p.seed, user)}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.entries.Remove(k)
}

// Len is how many addresses and users the Pacer remembers.
func (p *Pacer) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.entries.Len()
}

// addressOf is the address a's failures count against: its IP, an IPv6 one's /64; the
// zero Addr for every address that is not IP.
func addressOf(a net.Addr) netip.Addr {
	var ip netip.Addr
	switch a := a.(type) {
	case *net.TCPAddr:
		ip = a.AddrPort().Addr()
	case *net.UDPAddr:
		ip = a.AddrPort().Addr()
	default:
		return netip.Addr{}
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is6() {
		if p, err := ip.Prefix(64); err == nil {
			ip = p.Addr()
		}
	}
	return ip
}
