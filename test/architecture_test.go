package test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestArchitecturePage keeps docs/architecture.md in step with the code: each walk (a text
// get, a binary quiet run, a meta run) names at most 15 steps, every function or method it names (`pkg.Type.Method`,
// `pkg.Func`, or `Type.Method` of any package) exists, and the package table lists every
// package under internal/.
func TestArchitecturePage(t *testing.T) {
	page, err := os.ReadFile("../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(page)
	names, dirs := declaredNames(t, "../internal")
	pkgs := map[string]bool{}
	for d := range dirs {
		pkgs[filepath.Base(d)] = true
	}

	walk := section(doc, "## A text `get`")
	if walk == "" {
		t.Fatal("docs/architecture.md has no section on a text get")
	}
	for _, w := range walks(walk) {
		if len(w.steps) == 0 || len(w.steps) > 15 {
			t.Errorf("the walk of %s has %d steps, want 1 to 15", w.name, len(w.steps))
		}
	}
	for _, m := range regexp.MustCompile("`([A-Za-z]\\w*(?:\\.[A-Za-z]\\w*){1,2})`").FindAllStringSubmatch(walk, -1) {
		ref := m[1]
		parts := strings.Split(ref, ".")
		var ok bool
		if pkgs[parts[0]] {
			ok = names[ref]
		} else {
			ok = names["*."+ref] // Type.Method in any package
		}
		if !ok {
			t.Errorf("docs/architecture.md names `%s`, which the code does not declare", ref)
		}
	}

	table := section(doc, "## Packages")
	for d := range dirs {
		if !strings.Contains(table, "`internal/"+d+"`") {
			t.Errorf("docs/architecture.md's package table does not list internal/%s", d)
		}
	}
}

// section is the part of doc from the heading that starts with title to the next heading
// of its level.
func section(doc, title string) string {
	i := strings.Index(doc, "\n"+title)
	if i < 0 {
		return ""
	}
	rest := doc[i+1:]
	level := title[:strings.Index(title, " ")+1]
	if j := strings.Index(rest[len(title):], "\n"+level); j >= 0 {
		return rest[:len(title)+j]
	}
	return rest
}

// declaredNames parses the non-test Go files of every package under dir and returns the
// names they declare, as "pkg.Func", "pkg.Type", "pkg.Type.Method" and "*.Type.Method",
// and the set of package directories, relative to dir.
func declaredNames(t *testing.T, dir string) (map[string]bool, map[string]bool) {
	names, dirs := map[string]bool{}, map[string]bool{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		rel, err := filepath.Rel(dir, filepath.Dir(path))
		if err != nil {
			return err
		}
		dirs[filepath.ToSlash(rel)] = true
		pkg := filepath.Base(rel)
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					names[pkg+"."+d.Name.Name] = true
					continue
				}
				recv := d.Recv.List[0].Type
				if star, ok := recv.(*ast.StarExpr); ok {
					recv = star.X
				}
				if idx, ok := recv.(*ast.IndexExpr); ok { // a generic type's method
					recv = idx.X
				}
				if id, ok := recv.(*ast.Ident); ok {
					names[pkg+"."+id.Name+"."+d.Name.Name] = true
					names["*."+id.Name+"."+d.Name.Name] = true
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					if ts, ok := s.(*ast.TypeSpec); ok {
						names[pkg+"."+ts.Name.Name] = true
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names, dirs
}
