package placement

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// TestRoundTrip: the recorded file, read and written again, is the same file, so that
// regenerating it from a live nutcracker keeps its format.
func TestRoundTrip(t *testing.T) {
	const path = "../testdata/twemproxy_placement.txt"
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	keys, pools, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	comment, _, _ := strings.Cut(strings.TrimPrefix(string(want), "# "), "\n")
	var got bytes.Buffer
	if err := Write(&got, comment, keys, pools); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Errorf("written again, %s differs: %d bytes, was %d", path, got.Len(), len(want))
	}
}

func TestReadRefusesMalformed(t *testing.T) {
	for _, text := range []string{
		"key \"a\"\npool ketama md5\nowners 0\n",        // pool line without servers
		"key \"a\"\nowners 0\n",                         // owners before any pool
		"key \"a\"\npool ketama md5 h:1:1\nowners 00\n", // more owners than keys
		"key a\npool ketama md5 h:1:1\nowners 0\n",      // unquoted key
		"key \"a\"\npool ketama md5 h:1:1\nowner 0\n",   // unknown line
		"# nothing\n", // no keys, no pools
	} {
		path := t.TempDir() + "/p.txt"
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, _, err := Read(path); err == nil {
			t.Errorf("Read accepted %q", text)
		}
	}
}
