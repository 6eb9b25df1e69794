package test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// TestDocLinks keeps the pages' links in step with their headings: every link from a page
// of docs/ or a README to a page of the repository names a file that exists, and a link to
// a section (#anchor) names a heading of that page, as GitHub makes its anchors. Reference
// pages cite each other by section; a heading renamed must not leave readers at the top of
// a page.
func TestDocLinks(t *testing.T) {
	pages, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, "../README.md", "../deploy/README.md")
	anchors := map[string]map[string]bool{} // page (cleaned path) → its anchors
	anchorsOf := func(page string) map[string]bool {
		if a, ok := anchors[page]; ok {
			return a
		}
		data, err := os.ReadFile(page)
		if err != nil {
			return nil
		}
		a := headingAnchors(string(data))
		anchors[page] = a
		return a
	}
	links := 0
	for _, page := range pages {
		data, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range markdownLink.FindAllStringSubmatch(stripCode(string(data)), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			dest := filepath.Clean(page)
			if file != "" {
				dest = filepath.Join(filepath.Dir(page), file)
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s links to %s, which does not exist", page, target)
					continue
				}
			}
			links++
			if anchor == "" || !strings.HasSuffix(dest, ".md") {
				continue
			}
			if !anchorsOf(dest)[anchor] {
				t.Errorf("%s links to %s: %s has no heading whose anchor is #%s", page, target, dest, anchor)
			}
		}
	}
	if links < 20 {
		t.Fatalf("found %d links in the pages; the pattern must have missed them", links)
	}
}

// markdownLink is an inline link's target: [text](target).
var markdownLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// stripCode blanks fenced code blocks, whose brackets are not links.
func stripCode(doc string) string {
	var b strings.Builder
	fenced := false
	for line := range strings.Lines(doc) {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			b.WriteString("\n")
			continue
		}
		if fenced {
			b.WriteString("\n")
			continue
		}
		b.WriteString(line)
	}
	return b.String()
}

// headingAnchors is the set of anchors GitHub gives a page's headings: the heading's text
// lower-cased, without its markup and punctuation, spaces made hyphens; a repeated one
// gets -1, -2….
func headingAnchors(doc string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for line := range strings.Lines(stripCode(doc)) {
		line = strings.TrimRight(line, "\r\n")
		if !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(line, "#"))
		text = linkText.ReplaceAllString(text, "$1") // a link in a heading keeps its text
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

var linkText = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
