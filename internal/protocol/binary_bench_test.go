package protocol

import (
	"bufio"
	"testing"
)

// binLoopReader yields the same bytes forever without allocating.
type binLoopReader struct {
	data []byte
	off  int
}

func (r *binLoopReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		c := copy(p[n:], r.data[r.off:])
		n += c
		r.off = (r.off + c) % len(r.data)
	}
	return n, nil
}

func BenchmarkBinaryReadGet(b *testing.B) {
	pkt := binReq(0x0d, 1, 0, nil, []byte("user:1234567890:profile"), nil)
	d := NewBinaryReader(bufio.NewReader(&binLoopReader{data: pkt}), DefaultLimits())
	var req Request
	b.ReportAllocs()
	b.SetBytes(int64(len(pkt)))
	for b.Loop() {
		if err := d.Read(&req); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBinaryAppendHit(b *testing.B) {
	req := &Request{Binary: true, Op: OpGet, Opcode: 0x0d, Quiet: true, WithKey: true, Opaque: 7, Keys: [][]byte{[]byte("user:1234567890:profile")}}
	resp := &Response{Status: StatusOK, Value: make([]byte, 100), Flags: 1, Cas: 99}
	dst := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendBinaryResponse(dst[:0], req, resp)
	}
}
