package pool

import (
	"fmt"
	"testing"
)

// TestHashedPart is nutcracker's hash_tag rule: the bytes after the first open up to the
// next close after it, when there are any, else the whole key.
func TestHashedPart(t *testing.T) {
	for key, want := range map[string]string{
		"{user42}:cart": "user42",
		"a{b}c":         "b",
		"x{t}y{z}":      "t",       // the first tag
		"{}empty":       "{}empty", // nothing between: the whole key
		"t{}{a}":        "t{}{a}",  // the first open's close leaves nothing: not the second tag
		"}a{":           "}a{",     // a close before the open, none after it
		"}b{c}":         "c",       // the close after the open counts
		"{{a}}":         "{a",      // from the first open to the next close
		"{{}}":          "{",       //
		"open{":         "open{",   // no close
		"close}":        "close}",  // no open
		"plain":         "plain",
		"":              "",
		"k{ü}":          "ü", // bytes, not runes
	} {
		if got := string(hashedPart([]byte(key), '{', '}')); got != want {
			t.Errorf("hashedPart(%q) = %q, want %q", key, got, want)
		}
	}
}

// TestHashTagPlacement: with a hash tag, keys sharing a tag share a server, and a pool
// refuses a tag that is not two characters.
func TestHashTagPlacement(t *testing.T) {
	members := make([]Member, 5)
	for i := range members {
		members[i] = Member{Name: string(rune('a' + i)), Weight: 1}
	}
	p, err := New("p", Options{HashTag: "{}"}, members)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := New("p", Options{}, members)
	if err != nil {
		t.Fatal(err)
	}
	apart := 0
	for i := range 200 {
		cart, profile := fmt.Appendf(nil, "{user%d}:cart", i), fmt.Appendf(nil, "{user%d}:profile", i)
		if p.Owner(cart) != p.Owner(profile) {
			t.Fatalf("%s and %s on different servers with hash_tag {}", cart, profile)
		}
		if plain.Owner(cart) != plain.Owner(profile) {
			apart++
		}
	}
	if apart == 0 {
		t.Error("without a hash tag every pair shared a server: the test proves nothing")
	}
	for _, tag := range []string{"{", "{}}", "ab c"} {
		if _, err := New("p", Options{HashTag: tag}, members); err == nil {
			t.Errorf("hash_tag %q accepted", tag)
		}
	}
}
