package protocol

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os/exec"
	"reflect"
	"strconv"
	"testing"
	"time"
)

// binStartMemcached starts the real memcached on a free loopback port for the test's
// lifetime and returns its address. A missing memcached fails the test: its behaviour is
// the point of the tests that call this.
func binStartMemcached(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	cmd := exec.Command("/usr/bin/memcached", "-u", "nobody", "-l", "127.0.0.1", "-p", port, "-U", "0")
	if err := cmd.Start(); err != nil {
		t.Fatalf("start memcached: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })

	// memcached listens shortly after it starts; poll until it accepts, bounded.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(5 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return addr
		}
		select {
		case <-exited:
			t.Fatalf("memcached exited: %v", cmd.ProcessState)
		case <-deadline:
			t.Fatalf("memcached not listening on %s: %v", addr, err)
		case <-tick.C:
		}
	}
}

// binConnState is what became of a connection after a malformed packet and a noop.
type binConnState int

const (
	binUsable  binConnState = iota // the trailing noop was answered
	binClosed                      // the server closed the connection
	binStalled                     // neither: the server is still reading a body it misparsed
)

// binMemcachedAnswers sends in to memcached and reads until the answer to the noop with
// opaque noopOpaque, the end of the connection, or a second of silence.
func binMemcachedAnswers(t *testing.T, addr string, in []byte, noopOpaque uint32) ([]binAnswer, binConnState) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go c.Write(in) // a big body may not fit the socket buffers before memcached answers
	var out []byte
	buf := make([]byte, 64<<10)
	for {
		c.SetReadDeadline(time.Now().Add(time.Second))
		n, err := c.Read(buf)
		out = append(out, buf[:n]...)
		if as := binAnswers(t, binComplete(out)); len(as) > 0 && as[len(as)-1].Opaque == noopOpaque && as[len(as)-1].Opcode == 0x0a {
			return as, binUsable
		}
		var ne net.Error
		switch {
		case err == io.EOF:
			return binAnswers(t, out), binClosed
		case errors.As(err, &ne) && ne.Timeout():
			return binAnswers(t, out), binStalled
		case err != nil:
			t.Fatal(err)
		}
	}
}

// binComplete is the prefix of b made of whole response packets.
func binComplete(b []byte) []byte {
	n := 0
	for len(b)-n >= 24 {
		size := 24 + int(uint32(b[n+8])<<24|uint32(b[n+9])<<16|uint32(b[n+10])<<8|uint32(b[n+11]))
		if len(b)-n < size {
			break
		}
		n += size
	}
	return b[:n]
}

func TestBinaryMalformed(t *testing.T) {
	const noopOpq = 0xabcd
	noop := binReq(0x0a, noopOpq, 0, nil, nil, nil)
	noopAnswer := binAnswer{0x0a, 0, noopOpq, ""}
	invalid := func(opcode uint8) []binAnswer { return []binAnswer{{opcode, 0x04, 5, "Invalid arguments"}} }
	k := []byte("k")
	pkt := func(opcode uint8, ext, key, value []byte, bodyLen int) []byte {
		return binPacket{magic: 0x80, opcode: opcode, opaque: 5, ext: ext, key: key, value: value, keyLen: -1, extLen: -1, bodyLen: bodyLen}.bytes()
	}
	big := make([]byte, DefaultLimits().MaxValueBytes+1)
	tests := []struct {
		name  string
		in    []byte // followed by noop
		want  []binAnswer
		state binConnState
		// Where memcached 1.6.18 misparses the stream, what it does instead; moxi keeps
		// the stream in step (or closes it) rather than copy that.
		mcWant  []binAnswer
		mcState binConnState
	}{
		{name: "bad magic after a noop", in: append(binReq(0x0a, 1, 0, nil, nil, nil), binPacket{magic: 0x81, opcode: 0x0a, keyLen: -1, extLen: -1, bodyLen: -1}.bytes()...),
			want: []binAnswer{{0x0a, 0, 1, ""}}, state: binClosed},
		{name: "body shorter than key and extras", in: pkt(0x00, nil, []byte("abc"), nil, 2),
			want: []binAnswer{{0x00, 0x81, 5, "Unknown command"}}, state: binClosed},
		{name: "key longer than 250", in: pkt(0x00, nil, bytes.Repeat(k, 251), nil, -1), want: invalid(0x00), state: binClosed},
		{name: "key longer than 250 on unknown opcode", in: pkt(0x40, nil, bytes.Repeat(k, 251), nil, -1), want: invalid(0x40), state: binClosed},
		{name: "get with extras", in: pkt(0x00, binU32(0), k, nil, -1), want: invalid(0x00), state: binClosed},
		{name: "get without key", in: pkt(0x00, nil, nil, nil, -1), want: invalid(0x00), state: binClosed},
		{name: "getkq with value", in: pkt(0x0d, nil, k, []byte("v"), -1), want: invalid(0x0d), state: binClosed},
		{name: "get with 4 GiB body", in: pkt(0x00, nil, k, nil, 0xffffffff), want: invalid(0x00), state: binClosed},
		{name: "delete with value", in: pkt(0x04, nil, k, []byte("v"), -1), want: invalid(0x04), state: binClosed},
		{name: "set without extras", in: pkt(0x01, nil, k, []byte("v"), -1), want: invalid(0x01), state: binClosed},
		{name: "set without key", in: pkt(0x01, make([]byte, 8), nil, []byte("v"), -1), want: invalid(0x01), state: binClosed},
		{name: "append with extras", in: pkt(0x0e, make([]byte, 8), k, []byte("v"), -1), want: invalid(0x0e), state: binClosed},
		{name: "incr with 8 bytes of extras", in: pkt(0x05, make([]byte, 8), k, nil, -1), want: invalid(0x05), state: binClosed},
		{name: "incr with value", in: pkt(0x05, make([]byte, 20), k, []byte("1"), -1), want: invalid(0x05), state: binClosed},
		{name: "noop with body", in: pkt(0x0a, nil, nil, []byte("x"), -1), want: invalid(0x0a), state: binClosed},
		{name: "version with key", in: pkt(0x0b, nil, k, nil, -1), want: invalid(0x0b), state: binClosed},
		{name: "quit with key", in: pkt(0x07, nil, k, nil, -1), want: invalid(0x07), state: binClosed},
		{name: "flush with 8 bytes of extras", in: pkt(0x08, make([]byte, 8), nil, nil, -1), want: invalid(0x08), state: binClosed},
		{name: "flush with key", in: pkt(0x08, nil, k, nil, -1), want: invalid(0x08), state: binClosed},
		{name: "stat with extras", in: pkt(0x10, binU32(0), nil, nil, -1), want: invalid(0x10), state: binClosed},
		{name: "touch without extras", in: pkt(0x1c, nil, k, nil, -1), want: invalid(0x1c), state: binClosed},
		{name: "gat without key", in: pkt(0x1d, binU32(0), nil, nil, -1), want: invalid(0x1d), state: binClosed},
		{name: "unknown opcode", in: pkt(0x40, nil, nil, nil, -1),
			want: []binAnswer{{0x40, 0x81, 5, "Unknown command"}, noopAnswer}, state: binUsable},
		{name: "unknown opcode with value", in: pkt(0x40, nil, nil, []byte("xyz"), -1),
			want: []binAnswer{{0x40, 0x81, 5, "Unknown command"}, noopAnswer}, state: binUsable},
		{name: "sasl list mechs", in: pkt(0x20, nil, nil, nil, -1),
			want: []binAnswer{{0x20, 0x81, 5, "Unknown command"}, noopAnswer}, state: binUsable},
		{name: "set too large", in: pkt(0x01, make([]byte, 8), k, big, -1),
			want: []binAnswer{{0x01, 0x03, 5, "Too large."}, noopAnswer}, state: binUsable},
		{name: "setq too large is answered", in: pkt(0x11, make([]byte, 8), k, big, -1),
			want: []binAnswer{{0x11, 0x03, 5, "Too large."}, noopAnswer}, state: binUsable},
		{name: "appendq too large", in: pkt(0x19, nil, k, big, -1),
			want: []binAnswer{{0x19, 0x03, 5, "Too large."}, noopAnswer}, state: binUsable},
		{name: "quit", in: pkt(0x07, nil, nil, nil, -1), want: []binAnswer{{0x07, 0, 5, ""}}, state: binClosed},
		{name: "quitq", in: pkt(0x17, nil, nil, nil, -1), want: nil, state: binClosed},

		// (memcached swallows the body counted from after the key, eating the noop's header.)
		{name: "sasl auth", in: pkt(0x21, nil, []byte("PLAIN"), []byte("secret"), -1),
			want: []binAnswer{{0x21, 0x81, 5, "Unknown command"}, noopAnswer}, state: binUsable},
		{name: "unknown opcode with key", in: pkt(0x40, nil, []byte("key"), []byte("value"), -1),
			want: []binAnswer{{0x40, 0x81, 5, "Unknown command"}, noopAnswer}, state: binUsable,
			mcWant: []binAnswer{{0x40, 0x81, 5, "Unknown command"}}, mcState: binStalled},
		// memcached ignores touch's and stat's trailing bytes, then parses them as a packet
		// (a bad magic here; a 2 GiB body there).
		{name: "touch with trailing body", in: pkt(0x1c, binU32(0), k, make([]byte, 24), -1), want: invalid(0x1c), state: binClosed,
			mcWant: []binAnswer{{0x1c, 0x01, 5, "Not found"}}, mcState: binClosed},
		{name: "stat with trailing body", in: pkt(0x10, nil, []byte("bogus"), bytes.Repeat([]byte{0x80}, 24), -1), want: invalid(0x10), state: binClosed,
			mcWant: []binAnswer{{0x10, 0x01, 5, "Not found"}}, mcState: binStalled},
		// memcached 1.6.18 has no binary verbosity (and, as above, swallows 4 bytes too many
		// of an unknown command's body); moxi answers it like text verbosity.
		{name: "verbosity", in: pkt(0x1b, binU32(1), nil, nil, -1), want: []binAnswer{{0x1b, 0, 5, ""}, noopAnswer}, state: binUsable,
			mcWant: []binAnswer{{0x1b, 0x81, 5, "Unknown command"}}, mcState: binStalled},
	}
	addr := binStartMemcached(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := append(append([]byte(nil), tt.in...), noop...)
			out, closed := binServe(in, DefaultLimits())
			got := binAnswers(t, out)
			state := binUsable
			if closed {
				state = binClosed
			}
			if !reflect.DeepEqual(got, tt.want) || state != tt.state {
				t.Errorf("moxi: %+v state %d\nwant %+v state %d", got, state, tt.want, tt.state)
			}
			mcWant, mcState := tt.want, tt.state
			if tt.mcWant != nil {
				mcWant, mcState = tt.mcWant, tt.mcState
			}
			mcGot, mcGotState := binMemcachedAnswers(t, addr, in, noopOpq)
			if !reflect.DeepEqual(mcGot, mcWant) || mcGotState != mcState {
				t.Errorf("memcached: %+v state %d\nwant %+v state %d", mcGot, mcGotState, mcWant, mcState)
			}
		})
	}
}

// TestBinaryMatchesMemcached sends a conversation to memcached, decodes every answer with
// ReadBinaryResponse, decodes every request with BinaryReader, and checks that
// AppendBinaryResponse writes back exactly the bytes memcached sent, quiet suppressions
// included.
func TestBinaryMatchesMemcached(t *testing.T) {
	k, n, miss := []byte("k"), []byte("n"), []byte("missing")
	flagsExp := binExt(42, 4, 0, 4)
	incr := func(delta, initial uint64, exp uint32) []byte { return binExt(delta, 8, initial, 8, uint64(exp), 4) }
	conv := [][]byte{
		binReq(0x01, 1, 0, flagsExp, k, []byte("hello")),
		binReq(0x00, 2, 0, nil, k, nil),
		binReq(0x00, 3, 0, nil, miss, nil),
		binReq(0x0c, 4, 0, nil, k, nil),
		binReq(0x0c, 5, 0, nil, miss, nil),
		binReq(0x09, 6, 0, nil, miss, nil),
		binReq(0x0d, 7, 0, nil, k, nil),
		binReq(0x0d, 8, 0, nil, miss, nil),
		binReq(0x09, 9, 0, nil, k, nil),
		binReq(0x05, 10, 0, incr(1, 10, 0), n, nil),
		binReq(0x05, 11, 0, incr(5, 0, 0), n, nil),
		binReq(0x06, 12, 0, incr(1, 0, 0xffffffff), miss, nil),
		binReq(0x15, 13, 0, incr(1, 0, 0), n, nil),
		binReq(0x06, 14, 0, incr(100, 0, 0), n, nil),
		binReq(0x05, 15, 0, incr(1, 0, 0), k, nil),
		binReq(0x0b, 16, 0, nil, nil, nil),
		binReq(0x10, 17, 0, nil, []byte("settings"), nil),
		binReq(0x10, 18, 0, nil, nil, nil),
		binReq(0x10, 19, 0, nil, []byte("bogus"), nil),
		binReq(0x1c, 20, 0, binU32(100), k, nil),
		binReq(0x1c, 21, 0, binU32(100), miss, nil),
		binReq(0x1d, 22, 0, binU32(100), k, nil),
		binReq(0x23, 23, 0, binU32(100), k, nil),
		binReq(0x23, 24, 0, binU32(100), miss, nil),
		binReq(0x1e, 25, 0, binU32(100), miss, nil),
		binReq(0x24, 26, 0, binU32(100), miss, nil),
		binReq(0x02, 27, 0, flagsExp, k, []byte("x")),
		binReq(0x12, 28, 0, flagsExp, k, []byte("x")),
		binReq(0x03, 29, 0, flagsExp, miss, []byte("x")),
		binReq(0x13, 30, 0, flagsExp, miss, []byte("x")),
		binReq(0x0e, 31, 0, nil, k, []byte("!")),
		binReq(0x0f, 32, 0, nil, miss, []byte("!")),
		binReq(0x1a, 33, 0, nil, k, []byte(">")),
		binReq(0x11, 34, 0, flagsExp, []byte("q"), []byte("quiet")),
		binReq(0x01, 35, 12345, flagsExp, k, []byte("x")),
		binReq(0x01, 36, 12345, flagsExp, miss, []byte("x")),
		binReq(0x04, 37, 12345, nil, k, nil),
		binReq(0x04, 38, 0, nil, miss, nil),
		binReq(0x14, 39, 0, nil, miss, nil),
		binReq(0x14, 40, 0, nil, []byte("q"), nil),
		binReq(0x00, 41, 0, nil, k, nil),
		binReq(0x08, 42, 0, nil, nil, nil),
		binReq(0x18, 43, 0, nil, nil, nil),
		binReq(0x0a, 44, 0, nil, nil, nil),
	}
	const lastOpaque = 44
	in := bytes.Join(conv, nil)

	addr := binStartMemcached(t)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(in); err != nil {
		t.Fatal(err)
	}
	var raw bytes.Buffer
	br := bufio.NewReader(io.TeeReader(c, &raw))
	answers := map[uint32]*Response{}
	resp := new(Response)
	for {
		var h BinaryResponseHeader
		if err := ReadBinaryResponse(br, DefaultLimits(), &h, resp); err != nil {
			t.Fatalf("ReadBinaryResponse after % x: %v", raw.Bytes(), err)
		}
		if h.Opcode == 0x10 && !h.StatEnd() {
			continue // resp collects the stat lines up to the terminator
		}
		answers[h.Opaque] = resp
		resp = new(Response)
		if h.Opaque == lastOpaque {
			break
		}
	}

	d := NewBinaryReader(bufio.NewReader(bytes.NewReader(in)), DefaultLimits())
	var ours []byte
	var req Request
	for range conv {
		if err := d.Read(&req); err != nil {
			t.Fatal(err)
		}
		resp, ok := answers[req.Opaque]
		if !ok {
			// memcached said nothing, so the answer was a suppressed one.
			resp = &Response{Status: StatusOK}
			if req.Op.IsRetrieval() {
				resp.Status = StatusNotFound
			}
		}
		ours = AppendBinaryResponse(ours, &req, resp)
	}
	if !bytes.Equal(ours, raw.Bytes()) {
		ga, wa := binAnswers(t, ours), binAnswers(t, raw.Bytes())
		for i := range min(len(ga), len(wa)) {
			if ga[i] != wa[i] {
				t.Fatalf("answer %d: moxi %+v, memcached %+v", i, ga[i], wa[i])
			}
		}
		t.Fatalf("moxi wrote %d bytes (%d answers), memcached %d (%d answers)\nmoxi % x\nmemcached % x", len(ours), len(ga), raw.Len(), len(wa), ours, raw.Bytes())
	}
}
