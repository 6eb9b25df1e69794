package test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestTaggedAcceptTests: `make accept` runs the tests named TestAccept* of the files tagged
// accept, and `make test` never compiles those files: a test there under another name would
// run nowhere, and one named TestAccept* elsewhere would run in both.
func TestTaggedAcceptTests(t *testing.T) {
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	testFunc := regexp.MustCompile(`(?m)^func (Test\w+)\(t \*testing\.T\)`)
	accepted := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		tagged := strings.HasPrefix(string(b), "//go:build accept\n")
		for _, m := range testFunc.FindAllStringSubmatch(string(b), -1) {
			name := m[1]
			switch named := strings.HasPrefix(name, "TestAccept"); {
			case tagged && !named:
				t.Errorf("%s: %s is tagged accept but not named TestAccept…: no make target runs it", f, name)
			case !tagged && named:
				t.Errorf("%s: %s is named TestAccept… but not tagged accept: make test runs it too", f, name)
			case tagged:
				accepted++
			}
		}
	}
	if accepted == 0 {
		t.Error("no accept test found: make accept would run nothing")
	}
}
