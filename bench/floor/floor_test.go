//go:build linux

package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// TestForwardsLikeMemcached sends the same pipelined text, meta and binary streams (sets,
// hits, misses, a multi-get, a value larger than one read, deletes, quiet sets) to memcached and through
// floor, framing only and with -codecs, and wants the same answers byte for byte: the bench
// reference must forward what it claims to, or its figures mean nothing.
func TestForwardsLikeMemcached(t *testing.T) {
	bin := buildFloor(t)
	for _, mode := range [][]string{nil, {"-codecs"}, {"-goroutines"}, {"-goroutines", "-codecs"}} {
		t.Run(fmt.Sprintf("floor %v", mode), func(t *testing.T) { forwardsLikeMemcached(t, bin, mode) })
	}
}

func forwardsLikeMemcached(t *testing.T, bin string, mode []string) {
	direct := memcachedtest.Start(t)
	through := memcachedtest.Start(t) // a server of its own: both start empty
	addr := startFloor(t, bin, through.Addr, 2, mode)

	big := bytes.Repeat([]byte("v"), 200<<10) // more than floor reads at once
	var text bytes.Buffer
	for i := range 50 {
		fmt.Fprintf(&text, "set k%d 0 0 %d\r\nval%d\r\nget k%d\r\nget miss%d\r\n", i, len(fmt.Sprint(i))+3, i, i, i)
	}
	fmt.Fprintf(&text, "set big 5 0 %d\r\n%s\r\nget k1 big k2 nope\r\ndelete k3\r\ndelete k3\r\nincr n 1\r\n", len(big), big)
	var meta bytes.Buffer
	for i := range 50 {
		fmt.Fprintf(&meta, "ms m%d %d T0 F3\r\nval%d\r\nmg m%d v f\r\nmg nope%d v\r\nmd m%d\r\nmn\r\n", i, len(fmt.Sprint(i))+3, i, i, i, i)
	}
	fmt.Fprintf(&meta, "ms mbig %d\r\n%s\r\nmg mbig v k\r\nma n\r\n", len(big), big)
	var bin1 bytes.Buffer
	for i := range 50 {
		key := fmt.Appendf(nil, "b%d", i)
		bin1.Write(packet(0x01, uint32(i), key, []byte{0, 0, 0, 7, 0, 0, 0, 0}, append([]byte("value-"), key...)))
		bin1.Write(packet(0x00, uint32(1000+i), key, nil, nil))
		bin1.Write(packet(0x00, uint32(2000+i), fmt.Appendf(nil, "none%d", i), nil, nil))
	}
	bin1.Write(packet(0x01, 9, []byte("bigb"), make([]byte, 8), big))
	bin1.Write(packet(0x00, 10, []byte("bigb"), nil, nil))
	bin1.Write(packet(0x04, 11, []byte("b1"), nil, nil))
	bin1.Write(packet(0x0a, 12, nil, nil, nil))
	for i := range 100 {
		bin1.Write(packet(0x11, uint32(3000+i), fmt.Appendf(nil, "q%d", i), make([]byte, 8), []byte("quiet")))
	}
	bin1.Write(packet(0x0a, 13, nil, nil, nil))
	bin1.Write(packet(0x00, 14, []byte("q99"), nil, nil))
	binSize := 50*3 + 6
	// Quiet gets, followed by opaque: 20 sets, then 40 getkq of which every other one
	// hits, then a noop.
	var quietGets bytes.Buffer
	for i := range 20 {
		quietGets.Write(packet(0x01, uint32(i), fmt.Appendf(nil, "g%d", i), make([]byte, 8), []byte("got")))
	}
	for i := range 40 {
		key := fmt.Appendf(nil, "g%d", i/2)
		if i%2 == 1 {
			key = fmt.Appendf(nil, "gone%d", i)
		}
		quietGets.Write(packet(0x0d, uint32(100+i), key, nil, nil))
	}
	quietGets.Write(packet(0x0a, 999, nil, nil, nil))

	cases := []struct {
		name    string
		stream  []byte
		answers func(*testing.T, io.Reader) []byte
	}{
		{"text", text.Bytes(), func(t *testing.T, r io.Reader) []byte { return readText(t, r, 50*3+5) }},
		// ms, two mg, md and mn: five answers for each i
		{"meta", meta.Bytes(), func(t *testing.T, r io.Reader) []byte { return readText(t, r, 50*5+3) }},
		{"binary", bin1.Bytes(), func(t *testing.T, r io.Reader) []byte { return readBinary(t, r, binSize) }},
		{"binary quiet gets", quietGets.Bytes(), func(t *testing.T, r io.Reader) []byte { return readBinary(t, r, 20+20+1) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := exchange(t, direct.Addr, c.stream, c.answers)
			got := exchange(t, addr, c.stream, c.answers)
			if !bytes.Equal(got, want) {
				i := 0
				for i < min(len(got), len(want)) && got[i] == want[i] {
					i++
				}
				t.Errorf("first difference at %d: got %q, want %q", i, got[max(0, i-40):min(len(got), i+40)], want[max(0, i-40):min(len(want), i+40)])
				t.Fatalf("through floor: %d bytes of answers, %q…; from memcached: %d bytes, %q…",
					len(got), head(got), len(want), head(want))
			}
		})
	}
}

// exchange writes stream to addr in one go and reads the answers back.
func exchange(t *testing.T, addr string, stream []byte, answers func(*testing.T, io.Reader) []byte) []byte {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	go func() { _, _ = c.Write(stream) }()
	return answers(t, c)
}

// readText reads n text answers: single lines, or VALUE blocks up to END.
func readText(t *testing.T, r io.Reader, n int) []byte {
	t.Helper()
	var out bytes.Buffer
	var buf []byte
	tmp := make([]byte, 64<<10)
	for n > 0 {
		if k := textAnswer(buf); k > 0 {
			out.Write(buf[:k])
			buf = buf[k:]
			n--
			continue
		}
		m, err := r.Read(tmp)
		if err != nil {
			t.Fatalf("%d answers short: %v", n, err)
		}
		buf = append(buf, tmp[:m]...)
	}
	return out.Bytes()
}

// readBinary reads n binary packets.
func readBinary(t *testing.T, r io.Reader, n int) []byte {
	t.Helper()
	var out bytes.Buffer
	hdr := make([]byte, binaryHeader)
	for ; n > 0; n-- {
		if _, err := io.ReadFull(r, hdr); err != nil {
			t.Fatalf("%d answers short: %v", n, err)
		}
		body := make([]byte, binary.BigEndian.Uint32(hdr[8:12]))
		if _, err := io.ReadFull(r, body); err != nil {
			t.Fatal(err)
		}
		out.Write(hdr)
		out.Write(body)
	}
	return out.Bytes()
}

// packet is a binary request.
func packet(op uint8, opaque uint32, key, extras, value []byte) []byte {
	p := make([]byte, binaryHeader, binaryHeader+len(extras)+len(key)+len(value))
	p[0], p[1] = 0x80, op
	binary.BigEndian.PutUint16(p[2:], uint16(len(key)))
	p[4] = uint8(len(extras))
	binary.BigEndian.PutUint32(p[8:], uint32(len(extras)+len(key)+len(value)))
	binary.BigEndian.PutUint32(p[12:], opaque)
	p = append(p, extras...)
	p = append(p, key...)
	return append(p, value...)
}

func head(b []byte) []byte { return b[:min(len(b), 80)] }

// TestQuietMissesLeaveNoWaiter: quiet gets that miss get no answer from memcached, so they
// must not stay in line for the next answer, which on a shared backend connection is
// another client's: a get after a client's run of misses is answered to its own client.
func TestQuietMissesLeaveNoWaiter(t *testing.T) {
	bin := buildFloor(t)
	for _, mode := range [][]string{nil, {"-codecs"}} {
		t.Run(fmt.Sprintf("floor %v", mode), func(t *testing.T) {
			// One loop: both clients share its backend connection.
			addr := startFloor(t, bin, memcachedtest.Start(t).Addr, 1, mode)
			var misses bytes.Buffer
			for i := range 10 {
				misses.Write(packet(0x0d, uint32(i), fmt.Appendf(nil, "absent%d", i), nil, nil))
			}
			misses.Write(packet(0x0a, 10, nil, nil, nil))
			first := exchange(t, addr, misses.Bytes(), func(t *testing.T, r io.Reader) []byte { return readBinary(t, r, 1) })
			if first[1] != 0x0a {
				t.Fatalf("the misses' client got opcode %#x, want the noop's answer", first[1])
			}
			got := exchange(t, addr, packet(0x0a, 77, nil, nil, nil), func(t *testing.T, r io.Reader) []byte { return readBinary(t, r, 1) })
			if op := binary.BigEndian.Uint32(got[12:16]); op != 77 {
				t.Fatalf("the second client's noop answered with opaque %d, want 77", op)
			}
		})
	}
}

// buildFloor builds the floor command for the test.
func buildFloor(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "floor")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	return bin
}

// startFloor runs bin with loops event loops in front of backend, with the flags of mode,
// and returns the address it listens on; the test's end kills it.
func startFloor(t *testing.T, bin, backend string, loops int, mode []string) string {
	t.Helper()
	addr := memcachedtest.FreeAddr(t)
	cmd := exec.Command(bin, append([]string{"-listen", addr, "-backend", backend, "-loops", fmt.Sprint(loops)}, mode...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if err := memcachedtest.WaitListening(addr, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	return addr
}
