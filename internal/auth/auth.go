// Package auth checks the credentials clients log in to moxi with — SASL PLAIN's message
// and the text protocol's "user password", as memcached -S and -Y take them — against the
// users of the users file, and paces a client that keeps failing.
package auth

import (
	"bytes"
	"crypto/subtle"
	"time"
)

// Mechanisms is the answer to SASL list mechs: the one mechanism moxi offers.
const Mechanisms = "PLAIN"

// The answers memcached -S and -Y give, which clients and their tests expect.
const (
	Authenticated = "Authenticated" // binary SASL auth succeeded
	TextStored    = "STORED"        // the text form's set succeeded
)

// Users is the users file's users, name → password. It is never changed once made: a reload
// makes a new one.
type Users struct {
	passwords map[string]string
}

// NewUsers keeps passwords (name → password); the map must not be changed afterwards.
func NewUsers(passwords map[string]string) *Users { return &Users{passwords: passwords} }

// Has reports whether name is a user.
func (u *Users) Has(name string) bool {
	_, ok := u.passwords[name]
	return ok
}

// Check reports whether password is name's. The comparison takes the same time whatever
// the password's content, so that timing does not tell how much of it was right.
func (u *Users) Check(name string, password []byte) bool {
	want, ok := u.passwords[name]
	if !ok {
		// Compare anyway, so that an unknown name costs what a known one does.
		subtle.ConstantTimeCompare(password, password)
		return false
	}
	return subtle.ConstantTimeCompare(password, []byte(want)) == 1
}

// ParsePlain splits a SASL PLAIN message (RFC 4616): "authzid NUL authcid NUL passwd". The
// authorization identity must be empty or the user's own: moxi has no proxy users.
func ParsePlain(msg []byte) (user string, password []byte, ok bool) {
	authzid, rest, ok1 := bytes.Cut(msg, []byte{0})
	authcid, passwd, ok2 := bytes.Cut(rest, []byte{0})
	if !ok1 || !ok2 || len(authcid) == 0 || bytes.IndexByte(passwd, 0) >= 0 {
		return "", nil, false
	}
	if len(authzid) > 0 && !bytes.Equal(authzid, authcid) {
		return "", nil, false
	}
	return string(authcid), passwd, true
}

// PlainMessage is the SASL PLAIN message that logs in as user with password, without an
// authorization identity: what moxi sends to servers that require SASL.
func PlainMessage(user string, password []byte) []byte {
	msg := make([]byte, 0, 2+len(user)+len(password))
	msg = append(append(msg, 0), user...)
	return append(append(msg, 0), password...)
}

// ParseText splits the data of the text protocol's login set, "user password", into its
// first two space-separated tokens, as memcached -Y reads them; ok is false when there are
// fewer than two.
func ParseText(data []byte) (user string, password []byte, ok bool) {
	fields := bytes.Fields(data)
	if len(fields) < 2 {
		return "", nil, false
	}
	return string(fields[0]), fields[1], true
}

// Pacing of a client's failed logins: the first few are answered at once (a typo, a
// rotated password), then each after a wait that doubles up to maxDelay. The failures
// counted are an address's or a user's, whatever the connection (Pacer); a connection's
// waits are its own: other clients are answered meanwhile.
const (
	freeFailures = 3
	firstDelay   = 100 * time.Millisecond
	maxDelay     = 5 * time.Second
)

// Delay is how long to wait before answering the failures-th failed login in a row (1 for
// the first) after the answer to the one before it.
func Delay(failures int) time.Duration {
	if failures <= freeFailures {
		return 0
	}
	d := firstDelay
	for range failures - freeFailures - 1 {
		d *= 2
		if d >= maxDelay {
			return maxDelay
		}
	}
	return d
}

// ClientKey is a stored key (auth.namespaces: "<user>:<key>") as its client named it: what
// follows the first colon, since user names have none.
func ClientKey(stored []byte) []byte {
	if i := bytes.IndexByte(stored, ':'); i >= 0 {
		return stored[i+1:]
	}
	return stored
}
