package proxy

// versionAnswer is what "version" and "stats" answer for a build of release stamped build:
// the release number first, x.y.z as memcached gives its own, because libmemcached,
// php-memcached and pylibmc parse the answer as numbers ("VERSION moxi …" broke memcstat and
// memcping); then the name, as mcrouter answers "<x.y.z> mcrouter"; then the build string
// when it says more than the number ("2.0.0 moxi/dev"). The number is always the release:
// a build string ("dev", "main", a commit hash) never takes its place, so any build parses.
//
// Clients take the number for a memcached version: libmemcached refuses a major of 0, and
// memccapable (as other clients that pick features by version) treats anything below 1.6
// as an old memcached. moxi speaks memcached 1.6's protocol, so its releases are numbered
// from 2 (the first moxi, the Couchbase proxy, ended at 1.8).
func versionAnswer(release, build string) string {
	if build == "" || build == release {
		return release + " moxi"
	}
	return release + " moxi/" + build
}
