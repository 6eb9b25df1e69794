package protocol

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

// TestReadGrowing: a block is read whole whatever its size against the chunks and however
// its bytes arrive, and a block cut short says so.
func TestReadGrowing(t *testing.T) {
	block := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*7 + i/growChunk)
		}
		return b
	}
	for _, n := range []int{0, 1, growChunk - 1, growChunk, growChunk + 1, 3*growChunk + 17, 1 << 20} {
		want := block(n)
		for name, r := range map[string]io.Reader{
			"whole":       bytes.NewReader(want),
			"byte a time": iotest.OneByteReader(bytes.NewReader(want)),
		} {
			got, err := readGrowing(bufio.NewReaderSize(r, 16), nil, n)
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("%d bytes, %s: got %d bytes, %v", n, name, len(got), err)
			}
		}
	}
	for _, tt := range []struct {
		name string
		sent int
		want error
	}{
		{"nothing sent", 0, io.EOF},
		{"cut within the first chunk", 10, io.ErrUnexpectedEOF},
		{"cut after chunks", 2*growChunk + 5, io.ErrUnexpectedEOF},
	} {
		_, err := readGrowing(bufio.NewReader(bytes.NewReader(block(tt.sent))), nil, 1<<20)
		if !errors.Is(err, tt.want) {
			t.Errorf("%s: err %v, want %v", tt.name, err, tt.want)
		}
	}
}
