package auth

import (
	"testing"
	"time"
)

func TestCheck(t *testing.T) {
	u := NewUsers(map[string]string{"alice": "secret", "bob": "pa:ss"})
	for _, tt := range []struct {
		user, password string
		want           bool
	}{
		{"alice", "secret", true},
		{"alice", "secre", false},
		{"alice", "secret2", false},
		{"alice", "", false},
		{"bob", "pa:ss", true},
		{"carol", "secret", false},
		{"", "", false},
	} {
		if got := u.Check(tt.user, []byte(tt.password)); got != tt.want {
			t.Errorf("Check(%q, %q) = %v, want %v", tt.user, tt.password, got, tt.want)
		}
	}
	if !u.Has("bob") || u.Has("carol") {
		t.Error("Has")
	}
}

func TestParsePlain(t *testing.T) {
	for _, tt := range []struct {
		msg, user, password string
		ok                  bool
	}{
		{"\x00alice\x00secret", "alice", "secret", true},
		{"alice\x00alice\x00secret", "alice", "secret", true},
		{"bob\x00alice\x00secret", "", "", false}, // acting as another user
		{"\x00alice\x00", "alice", "", true},      // an empty password, refused by Check
		{"\x00\x00secret", "", "", false},
		{"alice\x00secret", "", "", false},
		{"", "", "", false},
		{"\x00alice\x00sec\x00ret", "", "", false},
	} {
		user, password, ok := ParsePlain([]byte(tt.msg))
		if ok != tt.ok || user != tt.user || string(password) != tt.password {
			t.Errorf("ParsePlain(%q) = %q, %q, %v; want %q, %q, %v", tt.msg, user, password, ok, tt.user, tt.password, tt.ok)
		}
	}
}

func TestParseText(t *testing.T) {
	for _, tt := range []struct {
		data, user, password string
		ok                   bool
	}{
		{"alice secret", "alice", "secret", true},
		{"  alice   secret  extra", "alice", "secret", true},
		{"alice", "", "", false},
		{"", "", "", false},
	} {
		user, password, ok := ParseText([]byte(tt.data))
		if ok != tt.ok || user != tt.user || string(password) != tt.password {
			t.Errorf("ParseText(%q) = %q, %q, %v", tt.data, user, password, ok)
		}
	}
}

func TestDelay(t *testing.T) {
	want := []time.Duration{0, 0, 0, 0, 100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond}
	for n, w := range want {
		if got := Delay(n); got != w {
			t.Errorf("Delay(%d) = %v, want %v", n, got, w)
		}
	}
	if got := Delay(1000); got != maxDelay {
		t.Errorf("Delay(1000) = %v, want %v", got, maxDelay)
	}
}

func FuzzParsePlain(f *testing.F) {
	f.Add([]byte("\x00alice\x00secret"))
	f.Add([]byte("a\x00b\x00c\x00"))
	f.Fuzz(func(t *testing.T, msg []byte) {
		user, password, ok := ParsePlain(msg)
		if ok && (user == "" || len(user)+len(password) > len(msg)) {
			t.Fatalf("ParsePlain(%q) = %q, %q", msg, user, password)
		}
	})
}

func FuzzParseText(f *testing.F) {
	f.Add([]byte("alice secret"))
	f.Add([]byte(" \t"))
	f.Fuzz(func(t *testing.T, data []byte) {
		user, password, ok := ParseText(data)
		if ok && (user == "" || len(password) == 0 || len(user)+len(password) > len(data)) {
			t.Fatalf("ParseText(%q) = %q, %q", data, user, password)
		}
	})
}
