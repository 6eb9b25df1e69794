package peers

import (
	"bytes"
	"testing"
)

func TestLinesRoundTrip(t *testing.T) {
	var body []byte
	body = AppendKey(body, "main", []byte("user:1"))
	body = AppendFlushAll(body)
	body = AppendKey(body, `we"ird`, []byte{0, 0xff, '\n'})
	var got []string
	err := ParseLines(body, func(pool string, key []byte) { got = append(got, pool+"="+string(key)) }, func() { got = append(got, "flush") })
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"main=user:1", "flush", "we\"ird=\x00\xff\n"}
	if len(got) != len(want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %q, want %q", got, want)
		}
	}
}

func TestLinesRefused(t *testing.T) {
	for _, body := range []string{
		"",
		"\n\n",
		"{",
		`{"pool":"main"}`,
		`{"key_b64":"YQ=="}`,
		`{"pool":"main","key_b64":"!!"}`,
		`{"pool":"main","key_b64":""}`,
		`{"flush_all":true,"pool":"main"}`,
		"{\"pool\":\"main\",\"key_b64\":\"YQ==\"}\nnot json",
	} {
		called := false
		err := ParseLines([]byte(body), func(string, []byte) { called = true }, func() { called = true })
		if err == nil || called {
			t.Errorf("ParseLines(%q) = %v, called %v: want an error and nothing invalidated", body, err, called)
		}
	}
}

func FuzzParseLines(f *testing.F) {
	f.Add(AppendKey(AppendFlushAll(nil), "main", []byte("k")))
	f.Add([]byte(`{"pool":"a","key_b64":"YWJj"}` + "\n{"))
	f.Fuzz(func(t *testing.T, body []byte) {
		var keys [][]byte
		_ = ParseLines(body, func(pool string, key []byte) {
			if pool == "" || len(key) == 0 || len(key) > MaxKey {
				t.Fatalf("invalid line accepted: pool %q key %d bytes", pool, len(key))
			}
			keys = append(keys, key)
		}, func() {})
		// What was accepted encodes to lines that parse to the same keys.
		var again []byte
		for _, k := range keys {
			again = AppendKey(again, "p", k)
		}
		i := 0
		if len(keys) > 0 {
			if err := ParseLines(again, func(_ string, k []byte) {
				if !bytes.Equal(k, keys[i]) {
					t.Fatalf("key %d: %q became %q", i, keys[i], k)
				}
				i++
			}, func() {}); err != nil {
				t.Fatal(err)
			}
		}
	})
}
