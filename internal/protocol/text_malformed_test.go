package protocol

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// textVersionAnswer ends the expected output of every case that leaves the connection
// usable: each such input is followed by "version\r\n", which must still be understood.
const textVersionAnswer = "VERSION 1.6.18\r\n"

// textMalformedCases are inputs memcached rejects, with the bytes memcached 1.6.18 answers
// (observed by sending them to it; TestTextMalformedMatchesMemcached re-checks every case
// that has no `differs`) and whether it then closes the connection. The keys "n" and "s"
// are never stored by a case that reads them, so the answers do not depend on order.
var textMalformedCases = []struct {
	name   string
	in     string
	want   string // without the trailing textVersionAnswer
	closes bool
	// differs says why moxi deliberately answers otherwise than memcached; the case is then
	// not sent to memcached.
	differs string
}{
	{name: "unknown command", in: "bogus\r\n", want: "ERROR\r\n"},
	{name: "slabs automove", in: "slabs automove 1\r\n", want: "CLIENT_ERROR moxi is a proxy: send slabs to each memcached server directly\r\n",
		differs: "a proxy does not run memcached's admin commands; it says so in memcached's answer form"},
	{name: "slabs automove not a number", in: "slabs automove invalid\r\n", want: "CLIENT_ERROR bad command line format\r\n"},
	{name: "slabs automove level 3", in: "slabs automove 3\r\n", want: "ERROR\r\n"},
	{name: "slabs automove ratio without a number", in: "slabs automove ratio x\r\n", want: "ERROR\r\n"},
	{name: "slabs unknown", in: "slabs bogus 1\r\n", want: "ERROR\r\n"},
	{name: "lru", in: "lru mode flat\r\n", want: "CLIENT_ERROR moxi is a proxy: send lru to each memcached server directly\r\n",
		differs: "a proxy does not run memcached's admin commands; it says so in memcached's answer form"},
	{name: "lru_crawler", in: "lru_crawler metadump all\r\n", want: "CLIENT_ERROR moxi is a proxy: send lru_crawler to each memcached server directly\r\n",
		differs: "a proxy does not run memcached's admin commands; it says so in memcached's answer form"},
	{name: "watch", in: "watch\r\n", want: "CLIENT_ERROR watch commands not allowed\r\n",
		differs: "memcached's answer when watch is disabled: a proxy has no log stream of the servers'"},
	{name: "shutdown", in: "shutdown\r\n", want: "ERROR: shutdown not enabled\r\n"},
	{name: "shutdown graceful", in: "shutdown graceful\r\n", want: "ERROR: shutdown not enabled\r\n"},
	{name: "cache_memlimit not a number", in: "cache_memlimit abc\r\n", want: "ERROR\r\n"},
	{name: "cache_memlimit without a limit", in: "cache_memlimit\r\n", want: "ERROR\r\n"},
	{name: "cache_memlimit too small", in: "cache_memlimit 7\r\n", want: "MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m\r\n"},
	{name: "cache_memlimit in bytes", in: "cache_memlimit 2000000000\r\n", want: "MEMLIMIT_ADJUST_FAILED input value is megabytes not bytes\r\n"},
	{name: "empty line", in: "\r\n", want: "ERROR\r\n"},
	{name: "only spaces", in: "   \r\n", want: "ERROR\r\n"},
	{name: "upper case command", in: "GET n\r\n", want: "ERROR\r\n"},
	{name: "get without key", in: "get\r\n", want: "ERROR\r\n"},
	{name: "get without key trailing space", in: "get \r\n", want: "ERROR\r\n"},
	{name: "get key too long", in: "get " + strings.Repeat("k", 251) + "\r\n", want: "CLIENT_ERROR bad command line format\r\n"},
	{name: "get second key too long", in: "get n " + strings.Repeat("k", 251) + "\r\n", want: "CLIENT_ERROR bad command line format\r\n"},
	{name: "length over int32", in: "set s 0 0 4294967295\r\n", want: "CLIENT_ERROR bad command line format\r\n"},
	{name: "length at int32 max", in: "set s 0 0 2147483646\r\n", want: "CLIENT_ERROR bad command line format\r\n"},
	{name: "set length not a number", in: "set s 0 0 abc\r\nhello\r\n", want: "CLIENT_ERROR bad command line format\r\nERROR\r\n"},
	{name: "set negative length", in: "set s 0 0 -1\r\nhello\r\n", want: "CLIENT_ERROR bad command line format\r\nERROR\r\n"},
	{name: "set negative flags", in: "set s -1 0 5\r\nhello\r\n", want: "CLIENT_ERROR bad command line format\r\nERROR\r\n"},
	{name: "set hex flags", in: "set s 0x1 0 5\r\nhello\r\n", want: "CLIENT_ERROR bad command line format\r\nERROR\r\n"},
	{name: "set flags over 64 bits", in: "set s 99999999999999999999 0 5\r\nhello\r\n", want: "CLIENT_ERROR bad command line format\r\nERROR\r\n"},
	{name: "set exptime not a number", in: "set s 0 abc 5\r\nhello\r\n", want: "CLIENT_ERROR bad command line format\r\nERROR\r\n"},
	{name: "set exptime over 64 bits", in: "set s 0 99999999999999999999 5\r\nhello\r\n", want: "CLIENT_ERROR bad command line format\r\nERROR\r\n"},
	{name: "set too few tokens", in: "set s 0 0\r\nhello\r\n", want: "ERROR\r\nERROR\r\n"},
	{name: "set too many tokens", in: "set s 0 0 5 6 7\r\nhello\r\n", want: "ERROR\r\nERROR\r\n"},
	{name: "set key too long", in: "set " + strings.Repeat("k", 251) + " 0 0 5\r\nhello\r\n", want: "CLIENT_ERROR bad command line format\r\nERROR\r\n"},
	{name: "set bad data chunk", in: "set s 0 0 5\r\nhelloXX", want: "CLIENT_ERROR bad data chunk\r\n"},
	{name: "set bad data chunk then command", in: "set s 0 0 5\r\nhelloXXset s 0 0 1\r\na\r\n", want: "CLIENT_ERROR bad data chunk\r\nSTORED\r\n"},
	{name: "set data ends in bare newline", in: "set s 0 0 5\r\nhello\nversion\r\n", want: "CLIENT_ERROR bad data chunk\r\nERROR\r\n"},
	{name: "set too large", in: "set s 0 0 2000000\r\n" + strings.Repeat("a", 2000000) + "\r\n", want: "SERVER_ERROR object too large for cache\r\n"},
	{name: "set too large noreply", in: "set s 0 0 2000000 noreply\r\n" + strings.Repeat("a", 2000000) + "\r\n", want: ""},
	{name: "set bad data chunk noreply", in: "set s 0 0 5 noreply\r\nhelloXX", want: ""},
	{name: "set bad number noreply", in: "set s 0 0 abc noreply\r\nhello\r\n", want: "ERROR\r\n"},
	{name: "set noreply as length", in: "set s 0 0 noreply\r\nhello\r\n", want: "ERROR\r\n"},
	{name: "cas without unique", in: "cas s 0 0 5\r\nhello\r\n", want: "ERROR\r\nERROR\r\n"},
	{name: "cas negative unique", in: "cas s 0 0 5 -1\r\nhello\r\n", want: "CLIENT_ERROR bad command line format\r\nERROR\r\n"},
	{name: "incr delta not a number", in: "incr n abc\r\n", want: "CLIENT_ERROR invalid numeric delta argument\r\n"},
	{name: "incr negative delta", in: "incr n -1\r\n", want: "CLIENT_ERROR invalid numeric delta argument\r\n"},
	{name: "incr delta over 64 bits", in: "incr n 18446744073709551616\r\n", want: "CLIENT_ERROR invalid numeric delta argument\r\n"},
	{name: "incr delta trailing junk", in: "incr n 1a\r\n", want: "CLIENT_ERROR invalid numeric delta argument\r\n"},
	{name: "incr bad delta noreply", in: "incr n abc noreply\r\n", want: ""},
	{name: "incr without delta", in: "incr n\r\n", want: "ERROR\r\n"},
	{name: "incr extra token ignored", in: "incr n 1 2\r\n", want: "NOT_FOUND\r\n"},
	{name: "decr key too long", in: "decr " + strings.Repeat("k", 251) + " 1\r\n", want: "CLIENT_ERROR bad command line format\r\n"},
	{name: "delete hold time", in: "delete n 1\r\n", want: "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n"},
	{name: "delete extra args", in: "delete n x y\r\n", want: "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n"},
	{name: "delete hold time noreply", in: "delete n 1 noreply\r\n", want: ""},
	{name: "delete too many tokens", in: "delete n 0 noreply x\r\n", want: "ERROR\r\n"},
	{name: "delete without key", in: "delete\r\n", want: "ERROR\r\n"},
	{name: "delete legacy zero", in: "delete n 0\r\n", want: "NOT_FOUND\r\n"},
	{name: "delete key too long", in: "delete " + strings.Repeat("k", 251) + "\r\n", want: "CLIENT_ERROR bad command line format\r\n"},
	{name: "touch exptime not a number", in: "touch n abc\r\n", want: "CLIENT_ERROR invalid exptime argument\r\n"},
	{name: "touch bad exptime noreply", in: "touch n abc noreply\r\n", want: ""},
	{name: "touch without exptime", in: "touch n\r\n", want: "ERROR\r\n"},
	{name: "touch too many tokens", in: "touch n 1 noreply x\r\n", want: "ERROR\r\n"},
	{name: "gat without exptime", in: "gat n\r\n", want: "CLIENT_ERROR invalid exptime argument\r\n"},
	{name: "gat without keys", in: "gat 0\r\n", want: "END\r\n"},
	{name: "flush_all delay not a number", in: "flush_all abc\r\n", want: "CLIENT_ERROR invalid exptime argument\r\n"},
	{name: "flush_all delay over 64 bits", in: "flush_all 99999999999999999999\r\n", want: "CLIENT_ERROR invalid exptime argument\r\n"},
	{name: "flush_all too many tokens", in: "flush_all 1 2 3\r\n", want: "ERROR\r\n"},
	{name: "verbosity without level", in: "verbosity\r\n", want: "ERROR\r\n"},
	{name: "verbosity level not a number", in: "verbosity abc\r\n", want: "CLIENT_ERROR bad command line format\r\n"},
	{name: "verbosity negative level", in: "verbosity -1\r\n", want: "CLIENT_ERROR bad command line format\r\n"},
	{name: "verbosity bad level noreply", in: "verbosity abc noreply\r\n", want: ""},
	{name: "verbosity too many tokens", in: "verbosity 1 2 3\r\n", want: "ERROR\r\n"},
	{name: "quit", in: "quit\r\n", closes: true},
	{name: "quit with junk", in: "quit now\r\n", closes: true},
	{name: "http request", in: "GET / HTTP/1.1\r\n", closes: true},
	{name: "long line without newline", in: strings.Repeat("x", 5000), closes: true},
	{name: "long set line without newline", in: "set s 0 0 1" + strings.Repeat(" ", 5000), closes: true},

	{name: "key with control bytes is stored, as memcached does", in: "set \x10\x10a\x01b\t 0 0 1\r\nx\r\n", want: "STORED\r\n"},
	{name: "key with NUL", in: "set a\x00b 0 0 1\r\nx\r\n", want: "CLIENT_ERROR bad command line format\r\nERROR\r\n",
		differs: "a NUL could not travel on in a key; memcached's C string handling is no model for it"},
	{name: "key with tab is a key, as in memcached", in: "get a\tb\r\n", want: "END\r\n"},
	{name: "key with carriage return", in: "get a\rb\r\n", want: "CLIENT_ERROR bad command line format\r\n",
		differs: "memcached answers END"},
	{name: "too many keys", in: "get" + strings.Repeat(" n", 10001) + "\r\n", want: "CLIENT_ERROR bad command line format\r\n",
		differs: "memcached has no key count limit (END)"},
	{name: "long line with newline", in: "set s 0 0 1" + strings.Repeat(" ", 3000) + "\r\nx\r\n", closes: true,
		differs: "memcached reads a long line that arrives whole (STORED); moxi's limit does not depend on packet boundaries"},
}

// textServe plays a server whose every key is missing over the decoder: it answers each
// request of in as memcached would on an empty cache. closed reports whether the
// connection would have been closed.
func textServe(in string) (out string, closed bool) {
	d := textReaderOf(in, 0, DefaultLimits())
	var buf []byte
	var req Request
	for {
		err := d.Read(&req)
		var re *RequestError
		switch {
		case errors.As(err, &re):
			buf = AppendTextError(buf, re)
			if re.Close {
				return string(buf), true
			}
			continue
		case err == io.EOF:
			return string(buf), false
		case err != nil:
			return string(buf), true
		}
		resps := []Response{{}}
		switch req.Op {
		case OpQuit:
			return string(buf), true
		case OpGet, OpGets, OpGat, OpGats:
			resps = make([]Response, len(req.Keys))
			for i := range resps {
				resps[i].Status = StatusNotFound
			}
		case OpDelete, OpIncr, OpDecr, OpTouch:
			resps[0].Status = StatusNotFound
		case OpVersion:
			resps[0].Value = []byte("1.6.18")
		}
		buf = AppendTextResponse(buf, &req, resps)
	}
}

func textMalformedInput(in string, closes bool) string {
	if closes {
		return in
	}
	return in + "version\r\n"
}

func textMalformedWant(want string, closes bool) string {
	if closes {
		return want
	}
	return want + textVersionAnswer
}

func TestTextMalformed(t *testing.T) {
	for _, tt := range textMalformedCases {
		t.Run(tt.name, func(t *testing.T) {
			out, closed := textServe(textMalformedInput(tt.in, tt.closes))
			if want := textMalformedWant(tt.want, tt.closes); out != want {
				t.Errorf("answer %q, want %q", out, want)
			}
			if closed != tt.closes {
				t.Errorf("closed = %v, want %v", closed, tt.closes)
			}
		})
	}
}

// TestTextMalformedMatchesMemcached sends the malformed cases to a real memcached 1.6.18
// and checks that it still answers what the table says moxi must answer.
func TestTextMalformedMatchesMemcached(t *testing.T) {
	addr := textStartMemcached(t)
	for _, tt := range textMalformedCases {
		if tt.differs != "" {
			continue
		}
		t.Run(tt.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if err := conn.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Write([]byte(textMalformedInput(tt.in, tt.closes))); err != nil {
				t.Fatal(err)
			}
			want := textMalformedWant(tt.want, tt.closes)
			var got []byte
			buf := make([]byte, 4096)
			closed := false
			for tt.closes || !bytes.HasSuffix(got, []byte(textVersionAnswer)) {
				n, err := conn.Read(buf)
				got = append(got, buf[:n]...)
				if err == io.EOF {
					closed = true
					break
				}
				if err != nil {
					t.Fatalf("after %q: %v", got, err)
				}
			}
			if string(got) != want || closed != tt.closes {
				t.Errorf("memcached answered %q (closed %v), table says %q (closed %v)", got, closed, want, tt.closes)
			}
		})
	}
}

// textStartMemcached starts /usr/bin/memcached on a free loopback port for the test and
// returns its address. A missing memcached fails the test: behaviour is the point here.
func textStartMemcached(t *testing.T) string {
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
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	// Poll until memcached listens: it is another process, so there is nothing to wait on.
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
		case <-tick.C:
		case <-deadline:
			t.Fatalf("memcached did not listen on %s: %v", addr, err)
		}
	}
}

// TestLongLineWithoutEndClosesAtOnce: like memcached, a command line (not a get) that has
// gone past the limit without its "\r\n" is given up as soon as that much has arrived, not
// when a "\n" comes, which a client sending garbage may never send (memcached's
// t/getset.t waits for the hang-up).
func TestLongLineWithoutEndClosesAtOnce(t *testing.T) {
	pr, pw := io.Pipe()
	defer pw.Close()
	go func() { _, _ = pw.Write([]byte("incr " + strings.Repeat(" ", 2048) + " manyspaces 1")) }() // and nothing more
	d := NewTextReader(bufio.NewReaderSize(pr, 16<<10), DefaultLimits())
	done := make(chan error, 1)
	go func() {
		var req Request
		done <- d.Read(&req)
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrLineTooLong) {
			t.Fatalf("Read: %v, want ErrLineTooLong", err)
		}
	case <-time.After(10 * time.Second):
		pr.CloseWithError(errors.New("test over"))
		t.Fatal("Read still waits for the end of a 2 KB command line")
	}
}
