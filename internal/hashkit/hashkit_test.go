package hashkit

import (
	"bufio"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestTwemproxyVectors checks every hash function against values recovered from a live
// nutcracker 0.5.0 (see the file's header for how).
func TestTwemproxyVectors(t *testing.T) {
	f, err := os.Open("testdata/twemproxy_hashes.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seen := make(map[string]int)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		name, rest, _ := strings.Cut(line, " ")
		i := strings.LastIndexByte(rest, ' ')
		key, err1 := strconv.Unquote(rest[:max(i, 0)])
		want, err2 := strconv.ParseUint(rest[i+1:], 10, 32)
		if i < 0 || err1 != nil || err2 != nil {
			t.Fatalf("bad line %q", line)
		}
		h, ok := Lookup(name)
		if !ok {
			t.Fatalf("no hash %q", name)
		}
		if got := h([]byte(key)); got != uint32(want) {
			t.Errorf("%s(%q) = %d, twemproxy %d", name, key, got, want)
		}
		seen[name]++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for _, n := range Names() {
		if seen[n] < 20 {
			t.Errorf("%s: %d vectors, want at least 20", n, seen[n])
		}
	}
}

// TestKnownValues pins values that do not come from twemproxy's quirks, so a wrong vector
// file cannot hide a wrong textbook algorithm.
func TestKnownValues(t *testing.T) {
	tests := []struct {
		name string
		f    Func
		key  string
		want uint32
	}{
		{"crc32a is CRC-32/IEEE", CRC32a, "123456789", 0xcbf43926},
		{"crc16 low bits are CRC-16/XMODEM", func(k []byte) uint32 { return CRC16(k) & 0xffff }, "123456789", 0x31c3},
		{"fnv1a_32 of a", FNV1a_32, "a", 0xe40c292c},
		{"fnv1_32 of a", FNV1_32, "a", 0x050c5d7e},
		{"md5 of empty key", MD5, "", 0xd98c1dd4},
		{"hsieh of empty key", Hsieh, "", 0},
		{"jenkins of empty key", Jenkins, "", 0xdeadbeef + 13},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.f([]byte(tt.key)); got != tt.want {
				t.Errorf("got %#x, want %#x", got, tt.want)
			}
		})
	}
}

// TestSignedBytes shows the quirk the vectors depend on: twemproxy's byte-wise hashes
// differ from the textbook ones exactly when a key has a byte ≥ 0x80.
func TestSignedBytes(t *testing.T) {
	textbook := func(key []byte) uint32 {
		h := uint32(2166136261)
		for _, b := range key {
			h ^= uint32(b)
			h *= 16777619
		}
		return h
	}
	if got, want := FNV1a_32([]byte("plain")), textbook([]byte("plain")); got != want {
		t.Errorf("ASCII key: %#x, textbook %#x", got, want)
	}
	if got, unsigned := FNV1a_32([]byte("caf\xe9")), textbook([]byte("caf\xe9")); got == unsigned {
		t.Errorf("high byte hashed unsigned: %#x", got)
	}
}

func TestCRC16Table(t *testing.T) {
	for i := range 256 {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		if crc16Table[i] != c {
			t.Fatalf("crc16Table[%d] = %#x, want %#x", i, crc16Table[i], c)
		}
	}
}

func TestLookup(t *testing.T) {
	want := []string{"crc16", "crc32", "crc32a", "fnv1_32", "fnv1_64", "fnv1a_32", "fnv1a_64",
		"hsieh", "jenkins", "md5", "murmur", "one_at_a_time"}
	if got := Names(); !slices.Equal(got, want) {
		t.Fatalf("Names() = %v, want %v", got, want)
	}
	for _, n := range want {
		if f, ok := Lookup(n); !ok || f == nil {
			t.Errorf("Lookup(%q) missing", n)
		}
	}
	if _, ok := Lookup("sha1"); ok {
		t.Error("Lookup(sha1) succeeded")
	}
}

func TestNoAllocs(t *testing.T) {
	key := []byte("user:12345:profile\xe9")
	for _, n := range Names() {
		f, _ := Lookup(n)
		if a := testing.AllocsPerRun(100, func() { f(key) }); a != 0 {
			t.Errorf("%s: %v allocs per call", n, a)
		}
	}
}

func BenchmarkHash(b *testing.B) {
	key := []byte("user:12345:session:8f14e45fceea167a")
	for _, n := range Names() {
		f, _ := Lookup(n)
		b.Run(n, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(key)))
			for b.Loop() {
				f(key)
			}
		})
	}
}
