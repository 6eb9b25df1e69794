package test

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// forwarder is a TCP relay between moxi and a memcached that counts the binary-protocol
// request packets it relays, by opcode, and can add latency in each direction.
type forwarder struct {
	ln      net.Listener
	target  string
	delay   time.Duration // added before relaying each chunk, in both directions
	opcodes [256]atomic.Int64

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func startForwarder(t testing.TB, target string, delay time.Duration) *forwarder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &forwarder{ln: ln, target: target, delay: delay}
	f.wg.Add(1)
	go f.accept()
	t.Cleanup(f.close)
	return f
}

func (f *forwarder) addr() string { return f.ln.Addr().String() }

// count is how many request packets with opcode went through.
func (f *forwarder) count(opcode byte) int64 { return f.opcodes[opcode].Load() }

func (f *forwarder) reset() {
	for i := range f.opcodes {
		f.opcodes[i].Store(0)
	}
}

func (f *forwarder) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", f.target)
		if err != nil {
			c.Close()
			continue
		}
		f.mu.Lock()
		f.conns = append(f.conns, c, s)
		f.mu.Unlock()
		f.wg.Add(2)
		go f.relay(s, c, true)
		go f.relay(c, s, false)
	}
}

// relay copies src to dst; requests (toServer) are parsed to count their opcodes.
func (f *forwarder) relay(dst, src net.Conn, toServer bool) {
	defer f.wg.Done()
	defer dst.Close()
	var parse packetCounter
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if toServer {
				parse.feed(buf[:n], &f.opcodes)
			}
			if f.delay > 0 {
				time.Sleep(f.delay) // the slow link this forwarder exists to simulate
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				src.Close()
			}
			return
		}
	}
}

// cut closes every connection relayed so far, both sides: a server that hangs up on its
// clients, its data kept.
func (f *forwarder) cut() {
	f.mu.Lock()
	conns := f.conns
	f.conns = nil
	f.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

func (f *forwarder) close() {
	f.ln.Close()
	f.mu.Lock()
	for _, c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// packetCounter follows a binary-protocol request stream across reads.
type packetCounter struct {
	header [24]byte
	have   int   // header bytes collected
	skip   int64 // body bytes still to pass over
}

func (p *packetCounter) feed(b []byte, counts *[256]atomic.Int64) {
	for len(b) > 0 {
		if p.skip > 0 {
			n := min(int64(len(b)), p.skip)
			p.skip -= n
			b = b[n:]
			continue
		}
		n := copy(p.header[p.have:], b)
		p.have += n
		b = b[n:]
		if p.have == len(p.header) {
			counts[p.header[1]].Add(1)
			p.skip = int64(binary.BigEndian.Uint32(p.header[8:12]))
			p.have = 0
		}
	}
}
