package moxi

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestRelease: the VERSION file holds a release number that libmemcached and memccapable
// read as a memcached 1.6 or later, and nothing else.
func TestRelease(t *testing.T) {
	m := regexp.MustCompile(`^(\d+)\.(\d+)\.(\d+)$`).FindStringSubmatch(Release)
	if m == nil {
		t.Fatalf("VERSION holds %q, want major.minor.patch", versionFile)
	}
	if major, _ := strconv.Atoi(m[1]); major < 2 {
		t.Errorf("release %s: a major below 2 reads as a memcached older than 1.6", Release)
	}
	if strings.Count(versionFile, "\n") > 1 {
		t.Errorf("VERSION holds more than the release number: %q", versionFile)
	}
}

func TestVersion(t *testing.T) {
	for build, want := range map[string]string{
		"":                  Release + "+dev",
		"dev":               Release + "+dev",
		Release:             Release,
		"main":              Release + "+main",
		"a1b2c3d":           Release + "+a1b2c3d",
		Release + "-3-gabc": Release + "+" + Release + "-3-gabc",
	} {
		if got := Version(build); got != want {
			t.Errorf("Version(%q) = %q, want %q", build, got, want)
		}
	}
}
