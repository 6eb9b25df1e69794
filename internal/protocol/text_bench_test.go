package protocol

import (
	"bufio"
	"testing"
)

// textRepeatReader is an endless stream of one request, so a benchmark decodes without
// rebuilding its input.
type textRepeatReader struct {
	b   []byte
	off int
}

func (r *textRepeatReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		c := copy(p[n:], r.b[r.off:])
		n += c
		r.off = (r.off + c) % len(r.b)
	}
	return n, nil
}

func BenchmarkTextReadGet(b *testing.B) {
	d := NewTextReader(bufio.NewReader(&textRepeatReader{b: []byte("get key\r\n")}), DefaultLimits())
	var req Request
	b.ReportAllocs()
	for b.Loop() {
		if err := d.Read(&req); err != nil || len(req.Keys) != 1 {
			b.Fatalf("Read: %v", err)
		}
	}
}

func BenchmarkTextReadSet(b *testing.B) {
	d := NewTextReader(bufio.NewReader(&textRepeatReader{b: []byte("set key 0 0 100\r\n" + string(make([]byte, 100)) + "\r\n")}), DefaultLimits())
	var req Request
	b.ReportAllocs()
	for b.Loop() {
		if err := d.Read(&req); err != nil || len(req.Value) != 100 {
			b.Fatalf("Read: %v", err)
		}
	}
}

func BenchmarkTextAppendHit(b *testing.B) {
	req := Request{Op: OpGet, Keys: [][]byte{[]byte("key")}}
	resps := []Response{{Status: StatusOK, Key: []byte("key"), Value: make([]byte, 100), Flags: 42}}
	buf := AppendTextResponse(nil, &req, resps)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendTextResponse(buf[:0], &req, resps)
	}
}
