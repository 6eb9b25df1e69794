package protocol

import (
	"bufio"
	"io"
	"sync"
)

// growChunk is the unit in which a block larger than the caller's buffer is kept while it
// arrives.
const growChunk = 4 << 10

// chunkPool recycles the chunks of blocks being read, so that peers that announce large
// blocks and send them slowly, or never finish them, leave no garbage behind.
var chunkPool = sync.Pool{New: func() any { return new([growChunk]byte) }}

// pieces holds a block that arrives in parts, in pooled chunks: it costs what has arrived,
// not what the block will be. The zero value is empty; release gives the chunks back.
type pieces struct {
	chunks []*[growChunk]byte
	n      int
}

// tail is the room left in the last chunk, a new one when it is full.
func (p *pieces) tail() []byte {
	if p.n == len(p.chunks)*growChunk {
		p.chunks = append(p.chunks, chunkPool.Get().(*[growChunk]byte))
	}
	return p.chunks[len(p.chunks)-1][p.n%growChunk:]
}

func (p *pieces) write(b []byte) {
	for len(b) > 0 {
		m := copy(p.tail(), b)
		p.n += m
		b = b[m:]
	}
}

// readFrom reads exactly n more bytes from r.
func (p *pieces) readFrom(r *bufio.Reader, n int) error {
	for n > 0 {
		t := p.tail()
		m, err := io.ReadFull(r, t[:min(len(t), n)])
		p.n += m
		n -= m
		if err != nil {
			return err
		}
	}
	return nil
}

// appendTo appends the block to dst.
func (p *pieces) appendTo(dst []byte) []byte {
	for i, c := range p.chunks {
		dst = append(dst, c[:min(growChunk, p.n-i*growChunk)]...)
	}
	return dst
}

func (p *pieces) release() {
	for i, c := range p.chunks {
		chunkPool.Put(c)
		p.chunks[i] = nil
	}
	p.chunks, p.n = p.chunks[:0], 0
}

// readGrowing reads exactly n bytes from r. A block that fits buf's capacity is read
// there; a larger one is kept in pieces as its bytes arrive and put together in one new
// buffer once complete: a peer that announces a large block and sends little of it costs
// what it sent. On error it returns io.EOF when r ended before the block began,
// io.ErrUnexpectedEOF within it, or r's error.
func readGrowing(r *bufio.Reader, buf []byte, n int) ([]byte, error) {
	if cap(buf) >= n {
		b := buf[:n]
		_, err := io.ReadFull(r, b)
		return b, err
	}
	var p pieces
	defer p.release()
	if err := p.readFrom(r, n); err != nil {
		if err == io.EOF && p.n > 0 {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return p.appendTo(make([]byte, 0, n)), nil
}
