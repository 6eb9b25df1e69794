package config

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Error is one problem found in a config file. Parse joins them (errors.Join), one per
// line of the error's text, in file order; errors.As finds the first.
type Error struct {
	File  string // the name given to Parse
	Line  int    // 1-based; 0 when the problem has no single place in the file
	Field string // dotted path such as "pools.main.servers[1].weight"; "" for YAML syntax
	Msg   string
}

// Error renders "file:line: field: message", leaving out the parts that are unknown.
func (e *Error) Error() string {
	s := e.File
	if e.Line > 0 {
		s += ":" + strconv.Itoa(e.Line)
	}
	if e.Field != "" {
		s += ": " + e.Field
	}
	return s + ": " + e.Msg
}

// maxErrors bounds the report: past this many, the rest are counted, not listed, so a
// file of garbage (or a fuzzer's alias fan-out) gives a readable answer quickly.
const maxErrors = 20

// decoder collects errors while the schema-driven readers below walk the node tree.
type decoder struct {
	file    string
	errs    []*Error
	dropped int
	bad     map[*yaml.Node]bool // nodes already reported, so checks built on them stay quiet
}

func (d *decoder) fail(n *yaml.Node, field, format string, args ...any) {
	if n != nil {
		if d.bad == nil {
			d.bad = map[*yaml.Node]bool{}
		}
		d.bad[n] = true
	}
	if len(d.errs) >= maxErrors {
		d.dropped++
		return
	}
	line := 0
	if n != nil {
		line = n.Line
	}
	d.errs = append(d.errs, &Error{File: d.file, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)})
}

// err returns every collected error, sorted by line, or nil.
func (d *decoder) err() error {
	if len(d.errs) == 0 {
		return nil
	}
	// Cross-reference checks run after the walk; sorting puts their errors where the
	// reader of the file expects them. Stable, so one line's errors keep their order.
	slices.SortStableFunc(d.errs, func(a, b *Error) int { return a.Line - b.Line })
	errs := make([]error, 0, len(d.errs)+1)
	for _, e := range d.errs {
		errs = append(errs, e)
	}
	if d.dropped > 0 {
		errs = append(errs, &Error{File: d.file, Msg: fmt.Sprintf("%d more errors not shown", d.dropped)})
	}
	return errors.Join(errs...)
}

// deref follows an alias (*name) to its anchored node, keeping the alias's own position
// so that messages point where the value is used.
func deref(n *yaml.Node) *yaml.Node {
	if n == nil || n.Kind != yaml.AliasNode || n.Alias == nil {
		return n
	}
	c := *n.Alias
	c.Line, c.Column = n.Line, n.Column
	return &c
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// describe names what a node is, for "want X, got Y" messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return strconv.Quote(n.Value)
	}
	return "an unsupported YAML node"
}

// join appends a key to a field path.
func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func index(path string, i int) string {
	return path + "[" + strconv.Itoa(i) + "]"
}

// entries calls fn for each key of the mapping n in file order, after reporting keys that
// are not strings or appear twice. A null n is an empty mapping.
func (d *decoder) entries(n *yaml.Node, path string, fn func(key string, k, v *yaml.Node)) {
	if isNull(n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		d.fail(n, path, "want a mapping, got %s", describe(n))
		return
	}
	first := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := deref(n.Content[i]), deref(n.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			d.fail(k, path, "keys must be plain strings, got %s", describe(k))
			continue
		}
		if line, dup := first[k.Value]; dup {
			d.fail(k, join(path, k.Value), "duplicate key (first at line %d)", line)
			continue
		}
		first[k.Value] = k.Line
		fn(k.Value, k, v)
	}
}

// field reads one key's value into its destination; it is called only for non-null values.
type field func(v *yaml.Node, path string)

// mapping reads the mapping n through fields, reporting keys that have no entry. It
// returns the value node of each key present, for checks that involve several keys.
func (d *decoder) mapping(n *yaml.Node, path string, fields map[string]field) map[string]*yaml.Node {
	seen := make(map[string]*yaml.Node, len(fields))
	d.entries(n, path, func(key string, k, v *yaml.Node) {
		set, ok := fields[key]
		if !ok {
			if key == "<<" {
				d.fail(k, join(path, key), "merge keys are not supported; repeat the settings")
				return
			}
			d.fail(k, join(path, key), "%s", d.unknownKey(key, v, path, fields))
			return
		}
		seen[key] = v
		if !isNull(v) {
			set(v, join(path, key))
		}
	})
	return seen
}

// scalar reports and returns false unless n is a single value.
func (d *decoder) scalar(n *yaml.Node, path string) bool {
	if n.Kind != yaml.ScalarNode {
		d.fail(n, path, "want a single value, got %s", describe(n))
		return false
	}
	return true
}

func (d *decoder) str(dst *string) field {
	return func(v *yaml.Node, path string) {
		if d.scalar(v, path) {
			*dst = v.Value
		}
	}
}

func (d *decoder) boolean(dst *bool) field {
	return func(v *yaml.Node, path string) {
		if !d.scalar(v, path) {
			return
		}
		if v.ShortTag() != "!!bool" || v.Decode(dst) != nil {
			d.fail(v, path, "want true or false, got %q", v.Value)
		}
	}
}

// integer reads an int that must lie within [lo, hi].
func (d *decoder) integer(dst *int, lo, hi int) field {
	return func(v *yaml.Node, path string) {
		if !d.scalar(v, path) {
			return
		}
		var i int
		if v.ShortTag() != "!!int" || v.Decode(&i) != nil {
			d.fail(v, path, "want an integer, got %q", v.Value)
			return
		}
		switch {
		case i < lo:
			d.fail(v, path, "must be at least %d, got %d", lo, i)
		case i > hi:
			d.fail(v, path, "must be at most %d, got %d", hi, i)
		default:
			*dst = i
		}
	}
}

// duration reads a Go duration ("250ms"); positive demands more than zero, otherwise
// zero is allowed. Negative durations are always errors.
func (d *decoder) duration(dst *time.Duration, positive bool) field {
	return func(v *yaml.Node, path string) {
		if !d.scalar(v, path) {
			return
		}
		t, err := time.ParseDuration(v.Value)
		switch {
		case err != nil:
			d.fail(v, path, "bad duration %q: want Go syntax such as 250ms or 2s", v.Value)
		case t < 0:
			d.fail(v, path, "must not be negative, got %s", v.Value)
		case t == 0 && positive:
			d.fail(v, path, "must be positive, got %s", v.Value)
		default:
			*dst = t
		}
	}
}

// instant reads an RFC 3339 time ("2026-12-01T10:00:00Z"); "" leaves dst zero.
func (d *decoder) instant(dst *time.Time) field {
	return func(v *yaml.Node, path string) {
		if !d.scalar(v, path) || v.Value == "" {
			return
		}
		t, err := time.Parse(time.RFC3339, v.Value)
		if err != nil {
			d.fail(v, path, "want an RFC 3339 time such as 2026-12-01T10:00:00Z: %v", err)
			return
		}
		*dst = t
	}
}

// oneOf reads a string that must be one of names.
func (d *decoder) oneOf(dst *string, what string, names []string) field {
	return func(v *yaml.Node, path string) {
		if !d.scalar(v, path) {
			return
		}
		if !slices.Contains(names, v.Value) {
			d.fail(v, path, "unknown %s %q: want one of %s", what, v.Value, strings.Join(names, ", "))
			return
		}
		*dst = v.Value
	}
}

// strings reads a list of non-empty strings; an empty list leaves dst nil.
func (d *decoder) strings(dst *[]string) field {
	return list(d, dst, "a list", func(e *yaml.Node, at string, _ []string) (string, bool) {
		if e.Value == "" {
			d.fail(e, at, "must not be empty")
			return "", false
		}
		return e.Value, true
	})
}

// buckets reads a histogram's upper bounds: positive numbers of seconds, ascending; an
// empty list leaves dst nil.
func (d *decoder) buckets(dst *[]float64) field {
	return list(d, dst, "a list of seconds such as [0.001, 0.01, 0.1, 1]", func(e *yaml.Node, at string, before []float64) (float64, bool) {
		var f float64
		tag := e.ShortTag()
		switch {
		case tag != "!!int" && tag != "!!float" || e.Decode(&f) != nil || math.IsNaN(f) || math.IsInf(f, 0):
			d.fail(e, at, "want a number of seconds, got %q", e.Value)
		case f <= 0:
			d.fail(e, at, "must be positive, got %s", e.Value)
		case len(before) > 0 && f <= before[len(before)-1]:
			d.fail(e, at, "must be greater than the bucket before it (%g), got %s", before[len(before)-1], e.Value)
		default:
			return f, true
		}
		return 0, false
	})
}

// list reads a list of single values, each through item, which reports what is wrong with
// one (given the ones kept before it) and says whether to keep it; an empty list leaves dst
// nil. want says what the list should be, for a value that is no list.
func list[T any](d *decoder, dst *[]T, want string, item func(e *yaml.Node, at string, before []T) (T, bool)) field {
	return func(v *yaml.Node, path string) {
		if v.Kind != yaml.SequenceNode {
			d.fail(v, path, "want %s, got %s", want, describe(v))
			return
		}
		var out []T
		for i, e := range v.Content {
			e = deref(e)
			at := index(path, i)
			if !d.scalar(e, at) {
				continue
			}
			if x, ok := item(e, at, out); ok {
				out = append(out, x)
			}
		}
		*dst = out
	}
}
