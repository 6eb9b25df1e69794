package handover

import (
	"bytes"
	"testing"
)

// FuzzParseMessage: whatever the bytes, ParseMessage does not panic, takes no more than it
// was given, and what it accepts encodes back to the very bytes it took.
func FuzzParseMessage(f *testing.F) {
	for _, tc := range sampleMessages() {
		b, err := AppendMessage(nil, tc.m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add(header(Version, typeConns, MaxConnsBytes+1))
	f.Add(header(Version+1, typeHello, 6))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, n, err := ParseMessage(b)
		if err != nil {
			return
		}
		if n < headerLen || n > len(b) {
			t.Fatalf("took %d of %d bytes", n, len(b))
		}
		again, err := AppendMessage(nil, m)
		if err != nil {
			t.Fatalf("accepted %#v, which does not encode: %v", m, err)
		}
		if !bytes.Equal(again, b[:n]) {
			t.Fatalf("%#v encodes to\n%x, parsed from\n%x", m, again, b[:n])
		}
	})
}
