package auth

import (
	"strconv"
	"sync/atomic"
	"unicode/utf8"

	"github.com/moxi-proxy/moxi/internal/auth/limit"
)

// LoggedFailures is how many failed logins a second the log shows; the rest are counted
// (moxi_auth_failures_total counts every one) and reported as a number beside the next
// line shown.
const LoggedFailures = 5

// LogLimiter lets a few log lines a second through, a burst of a second's worth, and
// counts the others. It is safe for concurrent use; the zero value is not: use
// NewLogLimiter.
type LogLimiter struct {
	bucket  *limit.Bucket
	skipped atomic.Uint64
}

// NewLogLimiter lets perSecond lines a second through.
func NewLogLimiter(perSecond int64) *LogLimiter {
	return &LogLimiter{bucket: limit.NewBucket(perSecond)}
}

// Allow reports whether to log one more line. When it does, skipped is how many lines
// were not logged since the last one that was, for the caller to say so.
func (l *LogLimiter) Allow() (ok bool, skipped uint64) {
	if !l.bucket.Take(1) {
		l.skipped.Add(1)
		return false, 0
	}
	return true, l.skipped.Swap(0)
}

// MaxLoggedName is the most of a user name a log line shows: a login's user name is
// whatever the client sent (a text login's data may be a megabyte).
const MaxLoggedName = 64

// LoggedName is name as a log line shows it: whole when short, else its first
// MaxLoggedName bytes (cut at a character's start), an ellipsis and its length.
func LoggedName(name string) string {
	if len(name) <= MaxLoggedName {
		return name
	}
	cut := MaxLoggedName
	for cut > MaxLoggedName-utf8.UTFMax && !utf8.RuneStart(name[cut]) {
		cut--
	}
	return name[:cut] + "…(" + strconv.Itoa(len(name)) + " bytes)"
}
