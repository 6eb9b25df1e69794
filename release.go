// Package moxi holds what describes this source tree as a whole: its release number, read
// from the VERSION file, which `make release`, the Dockerfile and the Kubernetes
// manifests read too.
package moxi

import (
	_ "embed"
	"strings"
)

//go:embed VERSION
var versionFile string

// Release is this tree's release number, major.minor.patch. Clients read it as a memcached
// version (libmemcached parses the numbers, memccapable picks features by them), so its
// major stays at 2 or above: moxi speaks memcached 1.6's protocol.
var Release = strings.TrimSpace(versionFile)

// Version is how a build of this tree names itself (--version, moxi_build_info): the
// release number, followed by "+<build>" (semantic versioning's build metadata) when the
// build string stamped into it with -ldflags "-X main.version=<build>" says something else
// ("" is a plain go build: "dev").
func Version(build string) string {
	build = Build(build)
	if build == Release {
		return Release
	}
	return Release + "+" + build
}

// Build is the build string a binary was stamped with, "dev" when it was not.
func Build(stamped string) string {
	if stamped == "" {
		return "dev"
	}
	return stamped
}
