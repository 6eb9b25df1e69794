package migrate

import (
	"bufio"
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/moxi-proxy/moxi/internal/itemcopy"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

func TestParseMetadumpLine(t *testing.T) {
	cases := []struct {
		name string
		line string
		key  string
		exp  int64
		ok   bool
	}{
		{"plain", "key=user:1 exp=-1 la=1796006608 cas=1 fetch=no cls=1 size=65", "user:1", -1, true},
		{"url-encoded", "key=b%2520c%3A exp=1796007583 la=1 cas=3 fetch=no cls=1 size=65", "b%20c:", 1796007583, true},
		{"end", "END", "", 0, false},
		{"no exp", "key=a la=1", "", 0, false},
		{"bad escape", "key=%zz exp=1", "", 0, false},
		{"empty key", "key= exp=1", "", 0, false},
		{"bad exp", "key=a exp=x", "", 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, ok := ParseMetadumpLine([]byte(tc.line))
			if ok != tc.ok || (ok && (string(e.Key) != tc.key || e.Exp != tc.exp)) {
				t.Fatalf("got %q %d %v; want %q %d %v", e.Key, e.Exp, ok, tc.key, tc.exp, tc.ok)
			}
		})
	}
}

func TestMetaGetAnswers(t *testing.T) {
	r := bufio.NewReader(strings.NewReader("VA 5 t78 f42\r\nhello\r\nEN\r\nVA 1 t-1 f0\r\nx\r\nHD\r\nVA 99 t1\r\n"))
	lim := protocol.Limits{MaxValueBytes: 1024}
	it, err := readItem(r, lim)
	if err != nil || !it.Found || string(it.Value) != "hello" || it.TTL != 78 || it.Flags != 42 {
		t.Fatalf("hit: %+v %v", it, err)
	}
	if it, err := readItem(r, lim); err != nil || it.Found {
		t.Fatalf("miss: %+v %v", it, err)
	}
	if it, err := readItem(r, lim); err != nil || it.TTL != -1 {
		t.Fatalf("no expiry: %+v %v", it, err)
	}
	if _, err := readItem(r, lim); !errors.Is(err, errMeta) {
		t.Fatalf("HD to an mg: %v, want errMeta", err)
	}
	if _, err := readItem(r, protocol.Limits{MaxValueBytes: 10}); err == nil {
		t.Fatal("a value over the bound was accepted")
	}
}

func TestMetaDeleteAnswers(t *testing.T) {
	r := bufio.NewReader(strings.NewReader("HD\r\nNF\r\nEN\r\n"))
	for _, want := range []bool{true, false} {
		if found, err := readDeleted(r, protocol.Limits{}); err != nil || found != want {
			t.Fatalf("delete: %v %v, want %v", found, err, want)
		}
	}
	if _, err := readDeleted(r, protocol.Limits{}); !errors.Is(err, errMeta) {
		t.Fatalf("EN to an md: %v, want errMeta", err)
	}
}

func TestMetaEncodingBase64Keys(t *testing.T) {
	get := itemcopy.Get([]byte("a key\x00with bytes"))
	got := string(protocol.AppendMetaRequest(nil, &get))
	if !strings.HasPrefix(got, "mg ") || strings.Count(got, " ") != 5 || !strings.HasSuffix(got, " b v f t\r\n") {
		t.Fatalf("meta get %q: a key with spaces must travel base64-encoded", got)
	}
	del := itemcopy.Delete([]byte("k"))
	if got := protocol.AppendMetaRequest(nil, &del); !bytes.Equal(got, []byte("md k\r\n")) {
		t.Fatalf("meta delete %q", got)
	}
}

func FuzzParseMetadumpLine(f *testing.F) {
	for _, s := range []string{"key=a exp=-1 la=1", "key=%41%zz exp=1", "END", "key= exp=", "key=a exp=99999999999999999999"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		e, ok := ParseMetadumpLine(line)
		if ok && (len(e.Key) == 0 || len(e.Key) > 250) {
			t.Fatalf("accepted key of %d bytes", len(e.Key))
		}
	})
}

func FuzzReadItem(f *testing.F) {
	for _, s := range []string{"VA 5 t78 f42\r\nhello\r\n", "EN\r\n", "VA -1\r\n", "VA 3 tx\r\nabc\r\n", "VA 2\r\nabcd"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		it, err := readItem(bufio.NewReader(bytes.NewReader(in)), protocol.Limits{MaxValueBytes: 1 << 10})
		if err == nil && it.Found && len(it.Value) > 1<<10 {
			t.Fatalf("value of %d bytes over the bound", len(it.Value))
		}
	})
}
