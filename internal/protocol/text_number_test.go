package protocol

import "testing"

// TestParseCounter: a stored value as memcached's incr and decr read it (safe_strtoull).
func TestParseCounter(t *testing.T) {
	tests := []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"12", 12, true},
		{"  12", 12, true},
		{"12 trailing words", 12, true},
		{"12\r\n", 12, true},
		{"+7", 7, true},
		{"-0", 0, true},
		{"-1", 0, false}, // strtoull's negation gives 2^64-1: negative as a signed number
		{"18446744073709551615", 1<<64 - 1, true},
		{"18446744073709551616", 0, false}, // ERANGE
		{"12abc", 0, false},
		{"", 0, false},
		{"   ", 0, false},
		{"abc", 0, false},
	}
	for _, tt := range tests {
		got, ok := ParseCounter([]byte(tt.in))
		if ok != tt.ok || ok && got != tt.want {
			t.Errorf("ParseCounter(%q) = %d, %v; want %d, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}
