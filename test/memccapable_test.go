package test

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

var memccapableResult = regexp.MustCompile(`(?m)^(ascii|binary) (.+?)\s+\[(\w+)\]$`)

// runMemccapable runs libmemcached's protocol conformance suite against addr and returns
// the passed and failed test names.
func runMemccapable(t *testing.T, addr string) (passed, failed []string) {
	t.Helper()
	bin := requireBinary(t, "memccapable")
	host, port, _ := strings.Cut(addr, ":")
	out, err := exec.Command(bin, "-h", host, "-p", port, "-t", "3").CombinedOutput()
	for _, m := range memccapableResult.FindAllStringSubmatch(string(out), -1) {
		name := m[1] + " " + m[2]
		if m[3] == "pass" {
			passed = append(passed, name)
		} else {
			failed = append(failed, name+" ["+m[3]+"]")
		}
	}
	if err != nil && len(failed) == 0 {
		t.Fatalf("memccapable: %v\n%s", err, out)
	}
	return passed, failed
}

func TestMemccapableEmbeddedDefault(t *testing.T) {
	t.Parallel() // mostly waits (timers, expiries, child tools): beside the other waiting tests
	moxi := startMoxi(t)
	passed, failed := runMemccapable(t, moxi.addr)
	t.Logf("memccapable through moxi (embedded default): %d passed, %d failed", len(passed), len(failed))
	if len(failed) > 0 || len(passed) != 54 {
		t.Errorf("memccapable: %d/54 passed; failed: %s\nmoxi log:\n%s", len(passed), strings.Join(failed, ", "), moxi.out.String())
	}
}
