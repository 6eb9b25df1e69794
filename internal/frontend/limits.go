package frontend

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moxi-proxy/moxi/internal/auth"
	"github.com/moxi-proxy/moxi/internal/auth/limit"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// Users' limits (auth.limits) and the cost of failed logins: what the server keeps of its
// clients' users across reloads, and where a request meets its user's limits.

// errRateLimited answers a request over its user's limits: SERVER_ERROR (meta requests
// too, as every server error), binary status 0x0086.
var errRateLimited = &protocol.RequestError{Status: protocol.StatusTempFailure, Msg: "rate limited"}

// logins is what a Server keeps of its clients' logins whatever the Auth in force: the
// pacing of failed logins and their log, made on first use, and the users' request
// counters, made by RegisterMetrics (nil before: nothing is counted).
type logins struct {
	gen atomic.Uint64 // the generations of SetAuth's Auths, from 1

	once  sync.Once
	pacer *auth.Pacer      // set once by once
	logs  *auth.LogLimiter // set once by once

	// moxi_user_requests_total and moxi_rate_limited_total: users named in auth.limits
	// have series of their own, every other user is counted as limit.Every, so that the
	// series are as few as the config's names.
	requests, limited         *prometheus.CounterVec
	everyRequests, everyLimit prometheus.Counter // their limit.Every series
}

// failures is the server's pacing of failed logins and their log.
func (s *Server) failures() (*auth.Pacer, *auth.LogLimiter) {
	l := &s.logins
	l.once.Do(func() { l.pacer, l.logs = auth.NewPacer(), auth.NewLogLimiter(auth.LoggedFailures) })
	return l.pacer, l.logs
}

// registerUserMetrics exports moxi_user_requests_total{user} and
// moxi_rate_limited_total{user} to reg, the series of limit.Every from the start.
func (s *Server) registerUserMetrics(reg prometheus.Registerer) {
	l := &s.logins
	l.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moxi_user_requests_total",
		Help: `Requests of logged-in clients, by user (each key of a multi-key get one), refused ones included: users named in auth.limits by name, every other user as "*".`,
	}, []string{"user"})
	l.limited = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "moxi_rate_limited_total",
		Help: `Requests refused over their user's auth.limits (answered SERVER_ERROR rate limited, or dropped when no answer was asked for), by user as moxi_user_requests_total.`,
	}, []string{"user"})
	l.everyRequests, l.everyLimit = l.requests.WithLabelValues(limit.Every), l.limited.WithLabelValues(limit.Every)
	reg.MustRegister(l.requests, l.limited)
}

// userMetrics is the counters of the user named, or limit.Every's; nil before
// RegisterMetrics.
func (l *logins) userMetrics(user string, named bool) (requests, limited prometheus.Counter) {
	switch {
	case l.requests == nil:
		return nil, nil
	case !named:
		return l.everyRequests, l.everyLimit
	}
	return l.requests.WithLabelValues(user), l.limited.WithLabelValues(user)
}

// overLimit counts the request just read, a logged-in client's, and charges it to its
// user's limits: its requests (a multi-key get's keys) and its keys and values. Over them
// it reports true: the request is answered SERVER_ERROR rate limited — or, when its client
// asked for no answer (text noreply, a binary quiet command), dropped — counted, and
// reaches no server. A multi-key get is charged whole or refused whole. quit, noop and mn
// are never refused: they end a client's pipeline.
func (c *conn) overLimit(a *Auth, l *login) bool {
	r := &c.req
	if r.Op == protocol.OpNoop || r.Op == protocol.OpMetaNoop {
		return false
	}
	if l.under != a.gen {
		l.under = a.gen
		l.limit.Store(a.Limits.For(l.user))
		l.requests, l.limited = c.s.logins.userMetrics(l.user, a.Limits.Named(l.user))
	}
	n := int64(1)
	if r.Op.IsRetrieval() {
		n = int64(max(1, len(r.Keys)))
	}
	if l.requests != nil {
		l.requests.Add(float64(n))
	}
	if u := l.limit.Load(); u == nil || u.Take(n, requestBytes(r)) {
		return false
	}
	if l.limited != nil {
		l.limited.Add(float64(n))
	}
	if r.NoReply || c.binary && r.Quiet {
		return true // dropped, as the client asked for no answer
	}
	c.refuse(errRateLimited)
	return true
}

// requestBytes is the keys and values r sends.
func requestBytes(r *protocol.Request) int64 {
	n := len(r.Key) + len(r.Value)
	for _, k := range r.Keys {
		n += len(k)
	}
	return int64(n)
}

// owe charges the keys and values of an answer to its user's bytes limit once the answer
// is made: resps answer req's keys (a multi-key get's, one each), or t's run of requests
// (one each). The bytes are sent whatever the bucket holds, so they are owed: the user's
// next requests wait until the debt is repaid (see limit.Bucket.Owe). It runs on whatever
// goroutine made the answer.
func (c *conn) owe(t *task, req *protocol.Request, resps []protocol.Response) {
	l := c.login.Load()
	if l == nil {
		return
	}
	u := l.limit.Load()
	if !u.LimitsBytes() {
		return
	}
	n := 0
	for i := range resps {
		v := resps[i].Value
		if len(v) == 0 || resps[i].Status != protocol.StatusOK {
			continue
		}
		n += len(v)
		switch {
		case t.single:
			n += len(keyOf(&t.batch[i]))
		case i < len(req.Keys):
			n += len(req.Keys[i])
		default:
			n += len(req.Key)
		}
	}
	u.Owe(int64(n))
}

// keyOf is the key of r, a single-key request.
func keyOf(r *protocol.Request) []byte {
	if r.Key == nil && len(r.Keys) > 0 {
		return r.Keys[0]
	}
	return r.Key
}

// paceFailure counts and logs the failed login of user (a user of the users file when
// known) and waits as long as the failures of the client's address and of user ask (see
// auth.Pacer) before it is answered. The log shows a few failures a second, and of each
// user name no more than auth.MaxLoggedName bytes: a client failing as fast as it can,
// with names a megabyte long, writes kilobytes of log, not gigabytes.
func (c *conn) paceFailure(user string, known bool) {
	c.failedLogins++
	c.s.authFailures.Add(1)
	pacer, logs := c.s.failures()
	wait := pacer.Fail(c.nc.RemoteAddr(), user, known)
	if ok, skipped := logs.Allow(); ok {
		if skipped > 0 {
			c.s.logger().Warn("client authentication failures not logged", "count", skipped)
		}
		// Never the password: the log is read by more people than the users file.
		c.s.logger().Warn("client authentication failed", "remote", c.nc.RemoteAddr().String(),
			"user", auth.LoggedName(user), "failures_in_a_row", c.failedLogins, "wait", wait)
	}
	if wait <= 0 {
		return
	}
	c.answers.endBurst() // the answers before this one are not held back meanwhile
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-c.s.stop:
	}
}
