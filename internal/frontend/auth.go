package frontend

import (
	"bytes"
	"encoding/base64"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moxi-proxy/moxi/internal/auth"
	"github.com/moxi-proxy/moxi/internal/auth/limit"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// Auth is the client authentication Server.SetAuth puts in force (config auth).
type Auth struct {
	Users *auth.Users
	// Namespaces: each user's keys are stored as "<user>:<key>". User names have no colon
	// (a users file line is "user:password"), so the client's key is what follows the
	// first one.
	Namespaces bool
	// Limits is each user's requests and bytes a second (config auth.limits); nil: none.
	// SetAuth carries over the buckets of the users whose limits did not change.
	Limits *limit.Users

	gen uint64 // set by SetAuth before it is in force: which Auth a login's look-up is of
}

// login is the user a connection authenticated as.
type login struct {
	user      string
	namespace []byte // "<user>:"

	// The user's limits and counters under the Auth in force (its gen; a generation, not
	// the Auth, so that an idle connection does not keep a replaced users file alive),
	// looked up again when another is (see overLimit). Owned by the reader; limit is read
	// by whoever makes an answer (owe) as well.
	under             uint64
	limit             atomic.Pointer[limit.User] // nil: no limit
	requests, limited prometheus.Counter         // nil: not counted (no RegisterMetrics)
}

// SetAuth puts a in force for every connection, open ones included: from now on a client
// must authenticate before any other request, and a connection logged in as a user a does
// not have is closed. nil: clients need not authenticate. The users' buckets that a's
// limits share with the Auth it replaces keep what they hold; each connection looks up
// its user's anew at its next request.
func (s *Server) SetAuth(a *Auth) {
	if a != nil {
		a.gen = s.logins.gen.Add(1)
		if prev := s.auth.Load(); prev != nil {
			a.Limits.Keep(prev.Limits, a.Users.Has)
		}
	}
	s.auth.Store(a)
	if a == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if l := c.login.Load(); l != nil && !a.Users.Has(l.user) {
			s.logger().Info("closing a connection of a user no longer in the users file", "remote", c.nc.RemoteAddr().String(), "user", l.user)
			hangUp(c.nc)
		}
	}
	if s.poller == nil {
		return
	}
	for _, p := range s.poller.takeIf(func(p *parked) bool { return p.login != nil && !a.Users.Has(p.login.user) }) {
		s.logger().Info("closing a connection of a user no longer in the users file", "remote", p.nc.RemoteAddr().String(), "user", p.login.user)
		s.closeParked(p)
	}
}

// The answers of the login exchange and of requests it refuses, as memcached -S (binary)
// and -Y (text) give them. Binary clients get status 0x0020 for each.
var (
	errUnauthenticated = &protocol.RequestError{Status: protocol.StatusAuthError, Line: "CLIENT_ERROR unauthenticated"}
	errAuthFailure     = &protocol.RequestError{Status: protocol.StatusAuthError, Line: "CLIENT_ERROR authentication failure"}
	errAuthFormat      = &protocol.RequestError{Status: protocol.StatusAuthError, Line: "CLIENT_ERROR bad authentication token format"}

	// With namespaces, the commands that would reach other tenants' keys.
	errFlushAll = &protocol.RequestError{Status: protocol.StatusAuthError, Msg: "flush_all not allowed"}
	errMemlimit = &protocol.RequestError{Status: protocol.StatusAuthError, Msg: "cache_memlimit not allowed"}
	errDetail   = &protocol.RequestError{Status: protocol.StatusAuthError, Msg: "stats detail not allowed"}
	// A key that, with the namespace in front, is longer than memcached takes.
	errNamespacedKey = &protocol.RequestError{Status: protocol.StatusInvalid, Msg: "key too long with its namespace"}
)

// guard answers the request just read itself when authentication is its business: a SASL
// command, or any request before the client authenticated. With namespaces, it renames
// the request's keys as stored, or refuses it. answered reports that the request was
// answered here and goes no further; err ends the connection (quit).
func (c *conn) guard() (answered bool, err error) {
	a := c.s.auth.Load()
	r := &c.req
	l := c.login.Load()
	switch {
	case a == nil: // a SASL command, with no authentication in force
		c.refuse(protocol.ErrSASLOff)
	case r.Op == protocol.OpQuit:
		return false, nil
	case r.Op == protocol.OpSaslListMechs:
		c.answerBinary(auth.Mechanisms)
	case r.Op == protocol.OpSaslAuth:
		user, password, ok := auth.ParsePlain(r.Value)
		ok = ok && string(r.Key) == auth.Mechanisms
		c.loginWith(a, user, password, ok, errAuthFailure)
	case r.Op == protocol.OpSaslStep: // PLAIN has a single step
		c.loginWith(a, "", nil, false, errAuthFailure)
	case l == nil && !c.binary && r.Op == protocol.OpSet: // memcached -Y's login
		user, password, ok := auth.ParseText(r.Value)
		c.loginWith(a, user, password, ok, errAuthFormat)
	case l == nil:
		c.refuse(errUnauthenticated)
	case c.overLimit(a, l):
		// Answered SERVER_ERROR rate limited, or dropped.
	case a.Namespaces:
		if re := c.storeKeys(l.namespace); re != nil {
			c.refuse(re)
			return true, nil
		}
		return false, nil
	default:
		return false, nil
	}
	return true, nil
}

// loginWith ends a login attempt as user with password, well formed when ok (else
// answered malformed): the connection is then logged in as user, or, on a failure, logged
// out, as memcached does. The failures in a row of an address or of a user are answered
// ever later, whatever the connection (paceFailure): a client guessing passwords waits,
// the others do not.
func (c *conn) loginWith(a *Auth, user string, password []byte, ok bool, malformed *protocol.RequestError) {
	if ok && a.Users.Check(user, password) {
		c.login.Store(&login{user: user, namespace: []byte(user + ":")})
		c.failedLogins = 0
		pacer, _ := c.s.failures()
		pacer.Succeed(user)
		if c.binary {
			c.answerBinary(auth.Authenticated)
		} else {
			c.answerNow(func(dst []byte) []byte { return append(dst, auth.TextStored+"\r\n"...) })
		}
		return
	}
	c.login.Store(nil)
	c.paceFailure(user, ok && a.Users.Has(user))
	if !ok {
		c.refuse(malformed)
		return
	}
	c.refuse(errAuthFailure)
}

// refuse answers the request just read with e, an error answer like the decoder's.
func (c *conn) refuse(e *protocol.RequestError) {
	c.startBatch() // what was read before it is answered first
	c.startRun()
	c.answerError(e)
}

// answerBinary answers the binary request just read with success and body as its value.
func (c *conn) answerBinary(body string) {
	c.startBatch()
	c.startRun()
	c.answerNow(func(dst []byte) []byte {
		return protocol.AppendBinaryResponse(dst, &c.req, &protocol.Response{Value: []byte(body)})
	})
}

// authorized reports whether the connection may reach the servers: no authentication is in
// force, or it logged in.
func (c *conn) authorized() bool {
	return c.s.auth.Load() == nil || c.login.Load() != nil
}

// namespace is the namespace of the connection's keys, nil when they have none.
func (c *conn) namespace() []byte {
	if a := c.s.auth.Load(); a != nil && a.Namespaces {
		if l := c.login.Load(); l != nil {
			return l.namespace
		}
	}
	return nil
}

// storeKeys renames the keys of the request just read as they are stored, ns + key, in
// c.storedKeys (valid, as the decoder's buffers are, until the next request is read), and
// sets the request's Namespace so that answers carry the client's keys. It refuses what
// would reach beyond the namespace.
func (c *conn) storeKeys(ns []byte) *protocol.RequestError {
	r := &c.req
	switch {
	case r.Op == protocol.OpFlushAll:
		return errFlushAll
	case r.Op == protocol.OpCacheMemlimit:
		return errMemlimit
	case r.Op == protocol.OpStats && bytes.HasPrefix(bytes.TrimSpace(r.Args), []byte("detail")):
		return errDetail
	}
	token := r.Op.IsMeta() && r.Meta.KeyToken != nil && r.Meta.Base64 // a base64 key token to rewrite as well
	need := 0
	for _, k := range r.Keys {
		need += len(ns) + len(k)
	}
	if r.Key != nil {
		need += len(ns) + len(r.Key)
		if token {
			need += base64.StdEncoding.EncodedLen(len(ns) + len(r.Key))
		}
	}
	if need == 0 {
		return nil // no keys: stats, version, verbosity, mn
	}
	if cap(c.storedKeys) < need {
		c.storedKeys = make([]byte, 0, need)
	}
	buf := c.storedKeys[:0] // never grows past need: the slices taken stay in place
	for i, k := range r.Keys {
		if len(ns)+len(k) > protocol.MaxKeyLength {
			return errNamespacedKey
		}
		buf, r.Keys[i] = appendStored(buf, ns, k)
	}
	if r.Key != nil {
		if len(ns)+len(r.Key) > protocol.MaxKeyLength {
			return errNamespacedKey
		}
		buf, r.Key = appendStored(buf, ns, r.Key)
		if r.Op.IsMeta() && r.Meta.KeyToken != nil {
			r.Meta.KeyToken = r.Key
			if token {
				start := len(buf)
				buf = base64.StdEncoding.AppendEncode(buf, r.Key)
				r.Meta.KeyToken = buf[start:len(buf):len(buf)]
			}
		}
	}
	r.Namespace = len(ns)
	return nil
}

// appendStored appends ns+key to buf, which has room for it, and returns buf and the
// stored key.
func appendStored(buf, ns, key []byte) ([]byte, []byte) {
	start := len(buf)
	buf = append(append(buf, ns...), key...)
	return buf, buf[start:len(buf):len(buf)]
}
