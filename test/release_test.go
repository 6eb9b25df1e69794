//go:build accept

package test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/moxi-proxy/moxi"
)

// TestAcceptMakeRelease runs `make release` into a temporary directory: a binary for each
// platform, named for the release in VERSION, built for that platform, with sums that
// sha256sum verifies; the one this machine can run prints the release as its version.
func TestAcceptMakeRelease(t *testing.T) {
	dist := t.TempDir()
	make := exec.Command("make", "release", "DIST="+dist)
	make.Dir = ".."
	if out, err := make.CombinedOutput(); err != nil {
		t.Fatalf("make release: %v\n%s", err, out)
	}
	sums, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	check := exec.Command("sha256sum", "--check", "--strict", "SHA256SUMS")
	check.Dir = dist
	if out, err := check.CombinedOutput(); err != nil {
		t.Fatalf("sha256sum --check: %v\n%s", err, out)
	}
	for _, platform := range []string{"linux/amd64", "linux/arm64", "darwin/arm64"} {
		goos, goarch, _ := strings.Cut(platform, "/")
		name := fmt.Sprintf("moxi-%s-%s-%s", moxi.Release, goos, goarch)
		if !bytes.Contains(sums, []byte("  "+name+"\n")) {
			t.Errorf("SHA256SUMS has no line for %s:\n%s", name, sums)
		}
		bin := filepath.Join(dist, name)
		info, err := exec.Command("go", "version", "-m", bin).CombinedOutput()
		if err != nil {
			t.Errorf("%s: %v\n%s", name, err, info)
			continue
		}
		for _, want := range []string{"GOOS=" + goos, "GOARCH=" + goarch, "CGO_ENABLED=0", "-trimpath=true"} {
			if !bytes.Contains(info, []byte(want)) {
				t.Errorf("%s was not built with %s:\n%s", name, want, info)
			}
		}
		run := exec.Command(bin, "--version")
		if goos != runtime.GOOS || goarch != runtime.GOARCH {
			// Another platform's binary runs here under qemu's user-mode emulation when it
			// is installed (not by make deps: it is large); else its build settings above,
			// from the command that built the one run, are what is checked.
			emulator, err := exec.LookPath("qemu-" + map[string]string{"arm64": "aarch64", "amd64": "x86_64"}[goarch] + "-static")
			if goos != "linux" || err != nil {
				continue
			}
			run = exec.Command(emulator, bin, "--version")
		}
		out, err := run.Output()
		if want := "moxi " + moxi.Release + "\n"; err != nil || string(out) != want {
			t.Errorf("%s --version: %q, %v; want %q", name, out, err, want)
		}
	}
}
