package protocol

import (
	"bufio"
	"errors"
	"strings"
	"testing"
)

// metaRead decodes every request in in and renders what a decoder error answers; requests
// are passed to f.
func metaRead(t *testing.T, in string, f func(*Request)) string {
	t.Helper()
	d := NewTextReader(bufio.NewReader(strings.NewReader(in)), DefaultLimits())
	var out []byte
	var req Request
	for {
		err := d.Read(&req)
		var re *RequestError
		switch {
		case errors.As(err, &re):
			out = AppendTextError(out, re)
			if re.Close {
				return string(out)
			}
		case err != nil:
			return string(out)
		default:
			f(&req)
		}
	}
}

func TestMetaParseErrors(t *testing.T) {
	long := strings.Repeat("a", 251)
	cases := []struct{ name, in, want string }{
		{"no key", "mg\r\n", "ERROR\r\n"},
		{"key too long", "mg " + long + " v\r\n", "CLIENT_ERROR bad command line format\r\n"},
		{"duplicate", "mg k v v\r\n", "CLIENT_ERROR duplicate flag\r\n"},
		{"invalid", "mg k x\r\n", "CLIENT_ERROR invalid flag\r\n"},
		{"bad token", "mg k T1x\r\n", "CLIENT_ERROR bad token in command line format\r\n"},
		{"bad base64", "mg abc b\r\n", "CLIENT_ERROR error decoding key\r\n"},
		{"too many", "mg k a b c d e f g h i j k l m n o p q r\r\n", "CLIENT_ERROR options flags are too long\r\n"},
		{"md invalid", "md k x\r\n", "CLIENT_ERROR invalid or duplicate flag\r\n"},
		{"md too many", "md k a b c d e f g h i j k l m n o p q r\r\n", "CLIENT_ERROR options flags too long\r\n"},
		{"md opaque", "md k O" + strings.Repeat("9", 32) + "\r\n", "CLIENT_ERROR opaque token too long\r\n"},
		{"ma mode", "ma k Mx\r\n", "CLIENT_ERROR invalid mode for ma M token\r\n"},
		{"ma mode length", "ma k MI2\r\n", "CLIENT_ERROR invalid or duplicate flag\r\n"},
		{"ms no length", "ms k\r\n", "CLIENT_ERROR bad command line format\r\n"},
		{"ms bad length not swallowed", "ms k S3\r\nabc\r\n", "CLIENT_ERROR bad command line format\r\nERROR\r\n"},
		{"ms bad flag swallowed", "ms k 3 x\r\nabc\r\n", "CLIENT_ERROR invalid flag\r\n"},
		{"ms mode swallowed", "ms k 3 MX\r\nabc\r\n", "CLIENT_ERROR invalid mode for ms M token\r\n"},
		{"ms bad chunk", "ms k 3\r\nabcd\r\n", "CLIENT_ERROR bad data chunk\r\nERROR\r\n"},
		{"ms too large", "ms k 2000000\r\n", "SERVER_ERROR object too large for cache\r\n"},
		{"ms F no message", "ms k 1 Fx\r\na\r\n", "CLIENT_ERROR bad command line format\r\n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := metaRead(t, c.in, func(r *Request) { t.Errorf("accepted %v", r.Op) })
			if got != c.want {
				t.Errorf("got %q, want %q", got, c.want)
			}
		})
	}
}

func TestMetaParse(t *testing.T) {
	var got []Request
	metaRead(t, "ms Zm9v 3 b T30 F5 C7 MA q O1 k c\r\nbar\r\nmg foo s v\r\nma k N0 J5 D3 M-\r\nmd k I T-1\r\nmn x\r\n", func(r *Request) {
		c := *r
		c.Key = append([]byte(nil), r.Key...)
		c.Value = append([]byte(nil), r.Value...)
		c.Meta.KeyToken = append([]byte(nil), r.Meta.KeyToken...)
		c.Meta.Flags = nil
		for _, f := range r.Meta.Flags {
			c.Meta.Flags = append(c.Meta.Flags, MetaFlag{f.Letter, append([]byte(nil), f.Token...)})
		}
		got = append(got, c)
	})
	if len(got) != 5 {
		t.Fatalf("%d requests", len(got))
	}
	ms := got[0].Meta
	if got[0].Op != OpMetaSet || string(got[0].Key) != "foo" || string(ms.KeyToken) != "Zm9v" ||
		string(got[0].Value) != "bar" || !ms.Base64 || !ms.Quiet || !ms.HasTTL || ms.TTL != 30 ||
		ms.ClientFlags != 5 || !ms.HasCas || ms.Cas != 7 || ms.Mode != 'A' || len(ms.Flags) != 9 {
		t.Errorf("ms: %+v", got[0])
	}
	if f, _ := ms.Flag('O'); string(f.Token) != "1" {
		t.Errorf("O token %q", f.Token)
	}
	if a := got[2].Meta; !a.Vivify || a.Initial != 5 || a.Delta != 3 || a.Mode != '-' {
		t.Errorf("ma: %+v", a)
	}
	if d := got[3].Meta; !d.Invalidate || d.TTL != -1 {
		t.Errorf("md: %+v", d)
	}
	if got[4].Op != OpMetaNoop {
		t.Errorf("mn: %v", got[4].Op)
	}
	want := "ms Zm9v 3 b T30 F5 C7 MA O1 k c\r\nbar\r\n"
	if enc := string(AppendMetaRequest(nil, &got[0])); enc != want {
		t.Errorf("AppendMetaRequest = %q, want %q", enc, want)
	}
}

func TestMetaAnswerRoundTrip(t *testing.T) {
	cases := []struct {
		name, op, wire string
		quiet          bool
		shown          bool
	}{
		{"va", "mg", "VA 3 s3 kZm9v b c1\r\nbar\r\n", false, true},
		{"va empty", "mg", "VA 0\r\n\r\n", false, true},
		{"hd", "mg", "HD\r\n", true, true},
		{"en quiet", "mg", "EN\r\n", true, false},
		{"en", "mg", "EN O1 kx\r\n", false, true},
		{"ms hd quiet", "ms", "HD c5\r\n", true, false},
		{"ms ns quiet", "ms", "NS\r\n", true, true},
		{"md hd quiet", "md", "HD\r\n", true, false},
		{"md nf quiet", "md", "NF O5\r\n", true, true},
		{"ma va quiet", "ma", "VA 1\r\n8\r\n", true, false},
		{"ma ex quiet", "ma", "EX\r\n", true, true},
		{"client error", "ma", "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n", true, true},
		{"server error", "ms", "SERVER_ERROR object too large for cache\r\n", false, true},
		{"other server error", "ma", "SERVER_ERROR out of memory\r\n", false, true},
		{"error", "mg", "ERROR\r\n", false, true},
		{"mn", "mn", "MN\r\n", false, true},
	}
	ops := map[string]Op{"mg": OpMetaGet, "ms": OpMetaSet, "md": OpMetaDelete, "ma": OpMetaArithmetic, "mn": OpMetaNoop}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var resp Response
			r := bufio.NewReaderSize(strings.NewReader(c.wire+"junk"), 16)
			if err := ReadMetaAnswer(r, DefaultLimits(), &resp); err != nil {
				t.Fatal(err)
			}
			req := Request{Op: ops[c.op], Meta: MetaRequest{Quiet: c.quiet}}
			got := string(AppendTextResponse(nil, &req, []Response{resp}))
			want := ""
			if c.shown {
				want = c.wire
			}
			if got != want {
				t.Errorf("rendered %q, want %q", got, want)
			}
		})
	}
}

func TestReadMetaAnswerBad(t *testing.T) {
	for _, in := range []string{"", "X", "VA\r\n", "VA x\r\n", "VA 5\r\nab\r\n", "VA 2\r\nabcd", "HDX\r\n", "HD\n", "FOO\r\n", "VA 99999999999\r\n", strings.Repeat("H", 5000) + "\r\n"} {
		var resp Response
		if err := ReadMetaAnswer(bufio.NewReaderSize(strings.NewReader(in), 16), DefaultLimits(), &resp); err == nil {
			t.Errorf("%.20q: accepted as %+v", in, resp)
		}
	}
}

func TestMetaDecodeKey(t *testing.T) {
	cases := []struct {
		in, want string
		ok       bool
	}{
		{"Zm9v", "foo", true},
		{"Zm8=", "fo", true},
		{"Zg==", "f", true},
		{"Zm9v!", "foo", true}, // bytes outside the alphabet are skipped
		{"Zg==Zm9v", "f", true},
		{"Zm9", "", false},
		{"A===", "", false},
		{"!!!!", "", false},
	}
	for _, c := range cases {
		got, ok := MetaDecodeKey(nil, []byte(c.in))
		if ok != c.ok || (ok && string(got) != c.want) {
			t.Errorf("MetaDecodeKey(%q) = %q, %v; want %q, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

// TestMetaReadAllocs: decoding a meta request allocates nothing once the reader and the
// request are warm.
func TestMetaReadAllocs(t *testing.T) {
	line := "mg Zm9vYmFy b v s t c f k O123 q\r\nms foo 3 T30 F5 c\r\nbar\r\n"
	in := strings.NewReader(line)
	br := bufio.NewReader(in)
	d := NewTextReader(br, DefaultLimits())
	var req Request
	read := func() {
		in.Reset(line)
		br.Reset(in)
		d.Reset(br)
		for range 2 {
			if err := d.Read(&req); err != nil {
				t.Fatal(err)
			}
		}
	}
	read()
	if n := testing.AllocsPerRun(100, read); n != 0 {
		t.Errorf("%v allocations per two meta requests", n)
	}
}
