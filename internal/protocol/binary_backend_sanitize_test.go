package protocol

import (
	"bufio"
	"bytes"
	"strings"
	"testing"
)

// TestBinaryResponseMsgOneLine: a server's error text reaches Msg on one line (CR, LF and
// NUL replaced), at most maxServerMsg bytes of it, and the stream stays in step after it.
func TestBinaryResponseMsgOneLine(t *testing.T) {
	long := strings.Repeat("a\r\n", 1000)
	tests := []struct {
		name   string
		body   string
		buffer int // the reader's buffer size
		want   string
	}{
		{"forged value block", "oops\r\nVALUE k 0 6\r\nforged\r\nEND", 4096, "oops  VALUE k 0 6  forged  END"},
		{"NUL", "oops\x00END", 4096, "oops END"},
		{"plain", "Out of memory allocating", 4096, "Out of memory allocating"},
		{"memcached's own", binMsgTempFailure, 4096, binMsgTempFailure},
		{"long", long, 4096, strings.ReplaceAll(long, "\r\n", "  ")[:maxServerMsg]},
		{"longer than the buffer", long, 16, strings.ReplaceAll(long, "\r\n", "  ")[:16]},
	}
	next := binResp(0x0a, 0, 9, 0, nil, nil, nil)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := append(binResp(0x00, BinStatusTempFailure, 7, 0, nil, nil, []byte(tt.body)), next...)
			br := bufio.NewReaderSize(bytes.NewReader(in), tt.buffer)
			var h BinaryResponseHeader
			var resp Response
			if err := ReadBinaryResponse(br, DefaultLimits(), &h, &resp); err != nil {
				t.Fatal(err)
			}
			if resp.Status != StatusTempFailure || resp.Msg != tt.want {
				t.Errorf("status %d, msg %q; want %d, %q", resp.Status, resp.Msg, StatusTempFailure, tt.want)
			}
			if err := ReadBinaryResponse(br, DefaultLimits(), &h, &resp); err != nil || h.Opcode != 0x0a || h.Opaque != 9 {
				t.Fatalf("next packet: %v %+v", err, h)
			}
		})
	}
}

// TestOneLine: OneLine leaves no byte that ends or cuts short a client's line.
func TestOneLine(t *testing.T) {
	for _, in := range []string{"", "ok", "\r\n", "a\x00b\rc\nd", "\xff\r\xfe"} {
		out := string(OneLine([]byte(in)))
		if len(out) != len(in) || strings.ContainsAny(out, "\r\n\x00") {
			t.Errorf("OneLine(%q) = %q", in, out)
		}
	}
}
