package test

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// walk is one walk of docs/architecture.md: its name (the heading) and the function each
// step names first, in order.
type walk struct {
	name  string
	steps []string
}

// walks reads the walks of the page's section on a text get: the section's own list, then
// each "### " subsection's.
func walks(section string) []walk {
	var out []walk
	name := "a text get"
	step := regexp.MustCompile("(?m)^\\d+\\. `([^`]+)`")
	for i, part := range strings.Split(section, "\n### ") {
		if i > 0 {
			name, _, _ = strings.Cut(part, "\n")
		}
		w := walk{name: strings.ToLower(name)}
		for _, m := range step.FindAllStringSubmatch(part, -1) {
			w.steps = append(w.steps, m[1])
		}
		out = append(out, w)
	}
	return out
}

// TestWalk checks docs/architecture.md's walks against what requests really pass: a moxi
// built with the walkprobe tag records the function of every documented step as it runs
// (package walk), and for a text get, a binary quiet run and a meta run the recording must
// be the page's list of steps, in order (a step repeated at once counts once). A function on
// the path renamed, or no longer passed, fails it.
func TestWalk(t *testing.T) {
	page, err := os.ReadFile("../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string][]string{}
	for _, w := range walks(section(string(page), "## A text `get`")) {
		documented[w.name] = w.steps
	}
	bin := filepath.Join(t.TempDir(), "moxi-walk")
	if out, err := exec.Command("go", "build", "-tags", "walkprobe", "-o", bin, "../cmd/moxi").CombinedOutput(); err != nil {
		t.Fatalf("building moxi with walkprobe: %v\n%s", err, out)
	}
	mc := cluster(t, 1)[0]
	record := filepath.Join(t.TempDir(), "walk")
	t.Setenv("MOXI_WALK_FILE", record) // moxi inherits it
	moxi := startMoxiBin(t, bin, "--config", writeConfig(t, poolConfig("", mc.Addr)))
	setKeys(t, moxi.addr, []string{"k"})

	getkq := func(opaque uint32, key string) []byte {
		b := make([]byte, 24, 24+len(key))
		b[0], b[1] = 0x80, 0x0d
		binary.BigEndian.PutUint16(b[2:], uint16(len(key)))
		binary.BigEndian.PutUint32(b[8:], uint32(len(key)))
		binary.BigEndian.PutUint32(b[12:], opaque)
		return append(b, key...)
	}
	noop := getkq(3, "")
	noop[1] = 0x0a
	cases := []struct {
		walk    string
		send    []byte
		answers int // answers to read: lines ending in END/EN (text, meta) or packets (binary)
		binary  bool
	}{
		{walk: "a text get", send: []byte("get k\r\n"), answers: 1},
		{walk: "a binary quiet run", send: append(append(getkq(1, "k"), getkq(2, "absent")...), noop...), answers: 2, binary: true},
		{walk: "a meta run", send: []byte("mg k v\r\nmg absent v\r\n"), answers: 2},
	}
	for _, tc := range cases {
		t.Run(tc.walk, func(t *testing.T) {
			want := documented[tc.walk]
			if len(want) == 0 {
				t.Fatalf("docs/architecture.md has no walk of %s", tc.walk)
			}
			// Steps recorded before the request's first one are the earlier requests' (the
			// last steps of setKeys' set may follow its answer), and a server connection's
			// background request may land inside a walk on a loaded machine: the walk is
			// tried up to three times, and every try must differ for the test to fail.
			var got []string
			for try := 0; try < 3; try++ {
				got = walkOnce(t, moxi.addr, record, want, tc.send, tc.answers, tc.binary)
				if slices.Equal(got, slices.Compact(slices.Clone(want))) {
					break
				}
			}
			if !slices.Equal(got, slices.Compact(slices.Clone(want))) {
				t.Errorf("%s passed:\n  %s\ndocs/architecture.md says:\n  %s", tc.walk, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
			}
		})
	}
}

// walkOnce sends one walk's requests on a new connection, reads their answers, and returns
// the steps moxi recorded from the walk's first step on, a step repeated at once counted once.
func walkOnce(t *testing.T, addr, record string, want []string, send []byte, answers int, binaryAnswers bool) []string {
	t.Helper()
	if err := os.WriteFile(record, nil, 0o644); err != nil { // moxi appends: start afresh
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(send); err != nil {
		t.Fatal(err)
	}
	if err := readAnswers(bufio.NewReader(c), answers, binaryAnswers); err != nil {
		t.Fatal(err)
	}
	var got []string
	deadline := time.Now().Add(10 * time.Second)
	for { // the last step's record may follow the answer's write by a moment
		b, err := os.ReadFile(record)
		if err != nil {
			t.Fatal(err)
		}
		got = slices.Compact(strings.Fields(string(b)))
		if len(got) > 0 && got[len(got)-1] == want[len(want)-1] || time.Now().After(deadline) {
			break
		}
	}
	if i := slices.Index(got, want[0]); i > 0 {
		got = got[i:]
	}
	return got
}

// readAnswers reads n answers: text or meta ones up to their END or EN (a VA's value
// skipped), binary packets by their length.
func readAnswers(r *bufio.Reader, n int, binaryAnswers bool) error {
	for range n {
		if binaryAnswers {
			h := make([]byte, 24)
			if _, err := io.ReadFull(r, h); err != nil {
				return err
			}
			if _, err := io.CopyN(io.Discard, r, int64(binary.BigEndian.Uint32(h[8:]))); err != nil {
				return err
			}
			continue
		}
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return err
			}
			if line == "END\r\n" || line == "EN\r\n" {
				break
			}
			var size int
			if _, err := fmt.Sscanf(line, "VA %d", &size); err == nil {
				if _, err := io.CopyN(io.Discard, r, int64(size+2)); err != nil {
					return err
				}
				break
			}
		}
	}
	return nil
}
