package limit

import (
	"sync"
	"time"
)

// Every is the name under which Users holds the rates of every user without rates of their
// own (config auth.limits."*").
const Every = "*"

// Rates is what one user may send a second; 0 is no limit.
type Rates struct {
	Requests int64 // requests, each key of a multi-key get one
	Bytes    int64 // keys and values, received and sent
}

// User is one user's buckets. It is safe for concurrent use: every connection of the user
// takes from the same buckets.
type User struct {
	rates    Rates
	requests *Bucket // nil: no limit
	bytes    *Bucket // nil: no limit
}

func newUser(r Rates) *User {
	u := &User{rates: r}
	if r.Requests > 0 {
		u.requests = NewBucket(r.Requests)
	}
	if r.Bytes > 0 {
		u.bytes = NewBucket(r.Bytes)
	}
	return u
}

// Take takes requests and bytes from the user's buckets, both or neither (see
// Bucket.Take), and reports whether it did. A nil User has no limit.
func (u *User) Take(requests, bytes int64) bool {
	if u == nil {
		return true
	}
	now := time.Now()
	if u.requests != nil && !u.requests.take(requests, now) {
		return false
	}
	if u.bytes != nil && !u.bytes.take(bytes, now) {
		if u.requests != nil {
			u.requests.Give(requests)
		}
		return false
	}
	return true
}

// LimitsBytes reports whether the user's bytes are limited. A nil User has no limit.
func (u *User) LimitsBytes() bool { return u != nil && u.bytes != nil }

// Owe takes bytes already sent (an answer's) from the user's bytes bucket, owing what it
// lacks. A nil User has no limit.
func (u *User) Owe(bytes int64) {
	if u != nil && u.bytes != nil {
		u.bytes.Owe(bytes)
	}
}

// Users is the users' limits of one config: a User for each user named, and one of its
// own, made on first use, for each other user when Every is named. A reload makes a new
// Users and hands the previous one to Keep.
//
// A Users is safe for concurrent use; nil has no limits.
type Users struct {
	named map[string]*User // read-only once made
	every *Rates           // nil: users not named have no limit

	mu     sync.Mutex
	others map[string]*User // the users not named, under every's rates; guarded by mu
}

// NewUsers makes the limits of rates, user name → rates, Every for every user not named.
func NewUsers(rates map[string]Rates) *Users {
	l := &Users{named: make(map[string]*User, len(rates)), others: map[string]*User{}}
	for name, r := range rates {
		if name == Every {
			l.every = &r
			continue
		}
		l.named[name] = newUser(r)
	}
	return l
}

// Named reports whether user has rates of their own (is named in the config).
func (l *Users) Named(user string) bool {
	if l == nil {
		return false
	}
	_, ok := l.named[user]
	return ok
}

// For is user's buckets; nil when user has no limit. The caller names only users that
// logged in, so that the buckets made for Every's users are as many as the users file's.
func (l *Users) For(user string) *User {
	if l == nil {
		return nil
	}
	if u, ok := l.named[user]; ok {
		if u.requests == nil && u.bytes == nil {
			return nil
		}
		return u
	}
	if l.every == nil || *l.every == (Rates{}) {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	u := l.others[user]
	if u == nil {
		u = newUser(*l.every)
		l.others[user] = u
	}
	return u
}

// Keep carries over from prev, the limits in force before l, the buckets of the users
// whose rates did not change, with what they hold or owe, so that a reload neither
// refills nor empties them; has reports the users still in the users file (the others'
// buckets are dropped). Call it before l is in use.
func (l *Users) Keep(prev *Users, has func(user string) bool) {
	if l == nil || prev == nil {
		return
	}
	for name, u := range l.named {
		if p, ok := prev.named[name]; ok && p.rates == u.rates {
			l.named[name] = p
		} else if p := prev.other(name); !ok && p != nil && p.rates == u.rates {
			l.named[name] = p // was one of Every's, now named with the same rates
		}
	}
	if l.every == nil {
		return
	}
	prev.mu.Lock()
	defer prev.mu.Unlock()
	for name, p := range prev.others {
		if _, named := l.named[name]; !named && p.rates == *l.every && has(name) {
			l.others[name] = p
		}
	}
	for name, p := range prev.named {
		if _, named := l.named[name]; !named && p.rates == *l.every && has(name) {
			l.others[name] = p // was named, now one of Every's with the same rates
		}
	}
}

// other is user's bucket among Every's, nil when none was made.
func (l *Users) other(user string) *User {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.others[user]
}
