package protocol

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"testing"
)

// metaReqString is what a meta request means, q aside: equal strings, equal requests.
func metaReqString(r *Request) string {
	m := r.Meta
	s := fmt.Sprintf("%v key=%q token=%q value=%q b=%v v=%v u=%v I=%v M=%d T=%v/%d N=%v/%d R=%v/%d C=%v/%d F=%d D=%d J=%d",
		r.Op, r.Key, m.KeyToken, r.Value, m.Base64, m.ReturnValue, m.NoBump, m.Invalidate, m.Mode,
		m.HasTTL, m.TTL, m.Vivify, m.VivifyTTL, m.Recache, m.RecacheTTL, m.HasCas, m.Cas, m.ClientFlags, m.Delta, m.Initial)
	for _, f := range m.Flags {
		if f.Letter != 'q' {
			s += fmt.Sprintf(" %c%q", f.Letter, f.Token)
		}
	}
	return s
}

// FuzzMetaRead feeds arbitrary bytes after a meta command name to the decoder: it must not
// panic or loop, its scratch stays bounded, and every meta request it accepts survives
// AppendMetaRequest (q dropped) and a second decode unchanged.
func FuzzMetaRead(f *testing.F) {
	for _, s := range []string{
		"mg foo v s t c f k O1 h l q\r\n", "ms Zm9v 3 b T30 F5 C7 MA q O1 k c I\r\nbar\r\n",
		"ma k N0 J5 D3 M- q v\r\n", "md k I T-1 C5 x\r\n", "mn\r\n", "ms k 3 x\r\nabc\r\n",
		"ms k 3\r\nabcd\r\n", "mg abc b\r\n", "mg k \xff\r\n", "ms k 99999999999\r\n", "mg k T\t5\r\n",
	} {
		f.Add([]byte(s))
	}
	lim := Limits{MaxKeyBytes: 250, MaxValueBytes: 4096, MaxMultigetKeys: 100, MaxLineBytes: 2048}
	f.Fuzz(func(t *testing.T, data []byte) {
		d := NewTextReader(bufio.NewReaderSize(bytes.NewReader(data), 16), lim)
		var req Request
		for reads := 0; ; reads++ {
			if reads > len(data)+1 {
				t.Fatalf("%d reads from %d bytes", reads, len(data))
			}
			err := d.Read(&req)
			if cap(d.value) > lim.MaxValueBytes+2 || cap(d.meta.line) > 2*lim.MaxLineBytes+32 || cap(d.meta.key) > 2*lim.MaxKeyBytes {
				t.Fatalf("scratch grew: value %d, line %d, key %d", cap(d.value), cap(d.meta.line), cap(d.meta.key))
			}
			var re *RequestError
			if errors.As(err, &re) && !re.Close {
				continue
			}
			if err != nil {
				return
			}
			if !req.Op.IsMeta() {
				continue
			}
			enc := AppendMetaRequest(nil, &req)
			req2 := textRoundTrip(t, lim, &req, enc, metaReqString)
			if req2.Meta.Quiet != MetaThroughMN(&req) {
				t.Fatalf("q through %q: %v, then %v", enc, req.Meta.Quiet, req2.Meta.Quiet)
			}
		}
	})
}

// FuzzReadMetaAnswer feeds arbitrary bytes as a server's answers: no panic, no loop, no
// allocation beyond the limits, and an answer it accepts renders back into the very bytes
// it was read from.
func FuzzReadMetaAnswer(f *testing.F) {
	for _, s := range []string{
		"VA 3 s3 kZm9v b c1\r\nbar\r\n", "HD\r\n", "EN O1 kx\r\n", "NF\r\nNS\r\nEX c0\r\nMN\r\n",
		"CLIENT_ERROR bad data chunk\r\n", "SERVER_ERROR out of memory\r\n", "ERROR\r\n",
		"VA 5\r\nab\r\n", "VA 99999999999999999999\r\n", "VA -1\r\n",
	} {
		f.Add([]byte(s))
	}
	lim := Limits{MaxKeyBytes: 250, MaxValueBytes: 4096, MaxMultigetKeys: 100, MaxLineBytes: 2048}
	req := Request{Op: OpMetaGet}
	f.Fuzz(func(t *testing.T, data []byte) {
		br := bufio.NewReaderSize(bytes.NewReader(data), 16)
		rest := data
		for reads := 0; ; reads++ {
			if reads > len(data)+1 {
				t.Fatalf("%d reads from %d bytes", reads, len(data))
			}
			var resp Response
			if err := ReadMetaAnswer(br, lim, &resp); err != nil {
				return
			}
			if cap(resp.Value) > lim.MaxValueBytes || cap(resp.Meta.Flags) > max(lim.MaxLineBytes, metaAnswerMinLine)+lim.MaxValueBytes+2 {
				t.Fatalf("answer of %d+%d bytes", cap(resp.Value), cap(resp.Meta.Flags))
			}
			out := AppendTextResponse(nil, &req, []Response{resp})
			if !bytes.HasPrefix(rest, out) {
				t.Fatalf("read %q, renders %q", rest[:min(len(rest), len(out))], out)
			}
			rest = rest[len(out):]
		}
	})
}
