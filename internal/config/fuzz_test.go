package config

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse feeds arbitrary bytes to Parse: it must never panic, and whatever it accepts
// must satisfy the invariants the proxy relies on and survive YAML() → Parse unchanged.
// Seeds are checked in under testdata/fuzz/FuzzParse; the shipped examples are added too.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("../../configs/*.yaml")
	for _, name := range append(files, "testdata/contract.yaml") {
		if b, err := os.ReadFile(name); err == nil {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data, "fuzz.yaml")
		if err != nil {
			if c != nil {
				t.Fatalf("config returned with error %v", err)
			}
			return
		}
		if len(c.Pools) == 0 || c.Pool(c.DefaultPool) == nil {
			t.Fatalf("accepted config without a usable default pool: %+v", c)
		}
		for _, r := range c.Routes {
			if c.Pool(r.Pool) == nil {
				t.Fatalf("route to missing pool %q", r.Pool)
			}
		}
		for _, p := range c.Pools {
			if (len(p.Servers) > 0) == (p.Embedded > 0) {
				t.Fatalf("pool %q: servers %d, embedded %d", p.Name, len(p.Servers), p.Embedded)
			}
			if p.Backup != "" && (p.Backup == p.Name || c.Pool(p.Backup) == nil) {
				t.Fatalf("pool %q: bad backup %q", p.Name, p.Backup)
			}
			if w := c.Pool(p.WarmFrom); p.WarmFrom != "" && (p.WarmFrom == p.Name || w == nil || w.WarmFrom != "") {
				t.Fatalf("pool %q: bad warm_from %q", p.Name, p.WarmFrom)
			}
			if s := p.Shadow; s != nil && (s.Pool == p.Name || c.Pool(s.Pool) == nil || !(s.Fraction >= 0 && s.Fraction <= 1)) {
				t.Fatalf("pool %q: bad shadow %+v", p.Name, *s)
			}
		}
		out, err := c.YAML()
		if err != nil {
			t.Fatalf("YAML: %v", err)
		}
		back, err := Parse(out, "effective.yaml")
		if err != nil {
			t.Fatalf("Parse(YAML()) = %v\ninput:\n%s\nYAML:\n%s", err, data, out)
		}
		equal(t, withoutLines(back), withoutLines(c))
	})
}
