package proxy

import "strings"

// versionAnswer is what "version" and "stats" answer for a build called v: the release
// number first, x.y.z as memcached gives its own, because libmemcached, php-memcached and
// pylibmc parse the answer as numbers ("VERSION moxi …" broke memcstat and memcping); then
// the name, as mcrouter answers "<x.y.z> mcrouter"; then the full build name when it says
// more than the number ("2.0.0 moxi/2.0.0-dev").
//
// Clients take the number for a memcached version: libmemcached refuses a major of 0, and
// memccapable (as other clients that pick features by version) treats anything below 1.6
// as an old memcached. moxi speaks memcached 1.6's protocol, so its releases are numbered
// from 2 (the first moxi, the Couchbase proxy, ended at 1.8).
func versionAnswer(v string) string {
	end := 0
	for end < len(v) && (v[end] == '.' || v[end] >= '0' && v[end] <= '9') {
		end++
	}
	parts := strings.FieldsFunc(v[:end], func(r rune) bool { return r == '.' })
	for len(parts) < 3 {
		parts = append(parts, "0")
	}
	number := strings.Join(parts[:3], ".")
	if number == v {
		return number + " moxi"
	}
	return number + " moxi/" + v
}
