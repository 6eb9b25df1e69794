package protocol

import (
	"bufio"
	"bytes"
	"errors"
	"testing"
)

// FuzzTextRead feeds arbitrary bytes to the decoder: it must not panic or loop, its
// scratch must stay within the limits, and every request it accepts must survive
// AppendTextRequest and a second decode unchanged.
func FuzzTextRead(f *testing.F) {
	lim := Limits{MaxKeyBytes: 250, MaxValueBytes: 4096, MaxMultigetKeys: 100, MaxLineBytes: 2048}
	f.Fuzz(func(t *testing.T, data []byte) {
		// A 16-byte buffer makes every line and block straddle buffer boundaries.
		d := NewTextReader(bufio.NewReaderSize(bytes.NewReader(data), 16), lim)
		var req Request
		// Each Read consumes at least one byte, so more reads than bytes means a loop.
		for reads := 0; ; reads++ {
			if reads > len(data)+1 {
				t.Fatalf("%d reads from %d bytes", reads, len(data))
			}
			err := d.Read(&req)
			if maxLine := lim.MaxLineBytes + lim.MaxMultigetKeys*(lim.MaxKeyBytes+1) + 16; cap(d.line) > 2*maxLine {
				t.Fatalf("line scratch grew to %d", cap(d.line))
			}
			if cap(d.value) > lim.MaxValueBytes+2 {
				t.Fatalf("value scratch grew to %d", cap(d.value))
			}
			var re *RequestError
			if errors.As(err, &re) && !re.Close {
				continue
			}
			if err != nil {
				return
			}
			textRoundTrip(t, lim, &req, AppendTextRequest(nil, &req), textReqString)
		}
	})
}

// textRoundTrip decodes enc, the encoding of req, and checks that it gives req back as
// render shows requests; it returns the decoded request.
func textRoundTrip(t *testing.T, lim Limits, req *Request, enc []byte, render func(*Request) string) Request {
	t.Helper()
	want := render(req)
	d := NewTextReader(bufio.NewReaderSize(bytes.NewReader(enc), 16), lim)
	var got Request
	if err := d.Read(&got); err != nil {
		t.Fatalf("decoding %q (from %s): %v", enc, want, err)
	}
	if s := render(&got); s != want {
		t.Fatalf("round trip through %q:\n got %s\nwant %s", enc, s, want)
	}
	return got
}
