package protocol

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
)

// textReaderOf decodes s through a bufio.Reader of the given size (0: bufio's default).
func textReaderOf(s string, size int, lim Limits) *TextReader {
	if size == 0 {
		size = 4096
	}
	return NewTextReader(bufio.NewReaderSize(strings.NewReader(s), size), lim)
}

// textReqString renders the fields of req that the text protocol carries, for comparison
// and readable failures.
func textReqString(r *Request) string {
	var keys []string
	for _, k := range r.Keys {
		keys = append(keys, fmt.Sprintf("%q", k))
	}
	return fmt.Sprintf("{Op:%v Key:%q Keys:[%s] Value:%q Flags:%d Exptime:%d Cas:%d Delta:%d Level:%d Args:%q NoReply:%v}",
		r.Op, r.Key, strings.Join(keys, " "), r.Value, r.Flags, r.Exptime, r.Cas, r.Delta, r.Level, r.Args, r.NoReply)
}

func textKeys(ks ...string) [][]byte {
	var out [][]byte
	for _, k := range ks {
		out = append(out, []byte(k))
	}
	return out
}

func TestTextRead(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want Request
	}{
		{"get", "get foo\r\n", Request{Op: OpGet, Keys: textKeys("foo")}},
		{"get many", "get a b c\r\n", Request{Op: OpGet, Keys: textKeys("a", "b", "c")}},
		{"get bare newline", "get foo\n", Request{Op: OpGet, Keys: textKeys("foo")}},
		{"get extra spaces", "  get   a  b  \r\n", Request{Op: OpGet, Keys: textKeys("a", "b")}},
		{"get noreply is a key", "get a noreply\r\n", Request{Op: OpGet, Keys: textKeys("a", "noreply")}},
		{"get key of max length", "get " + strings.Repeat("k", 250) + "\r\n", Request{Op: OpGet, Keys: textKeys(strings.Repeat("k", 250))}},
		{"gets", "gets a b\r\n", Request{Op: OpGets, Keys: textKeys("a", "b")}},
		{"gat", "gat 100 a b\r\n", Request{Op: OpGat, Exptime: 100, Keys: textKeys("a", "b")}},
		{"gats negative", "gats -1 a\r\n", Request{Op: OpGats, Exptime: -1, Keys: textKeys("a")}},
		{"gat no keys", "gat 0\r\n", Request{Op: OpGat}},
		{"set", "set k 5 10 3\r\nabc\r\n", Request{Op: OpSet, Key: []byte("k"), Flags: 5, Exptime: 10, Value: []byte("abc")}},
		{"set noreply", "set k 0 0 1 noreply\r\nx\r\n", Request{Op: OpSet, Key: []byte("k"), Value: []byte("x"), NoReply: true}},
		{"set empty value", "set k 0 0 0\r\n\r\n", Request{Op: OpSet, Key: []byte("k"), Value: []byte{}}},
		{"set value with crlf inside", "set k 0 0 4\r\na\r\nb\r\n", Request{Op: OpSet, Key: []byte("k"), Value: []byte("a\r\nb")}},
		{"set flags wrap to 32 bits", "set k 4294967297 0 1\r\nx\r\n", Request{Op: OpSet, Key: []byte("k"), Flags: 1, Value: []byte("x")}},
		{"set plus signs", "set k +1 +2 +1\r\nx\r\n", Request{Op: OpSet, Key: []byte("k"), Flags: 1, Exptime: 2, Value: []byte("x")}},
		{"set exptime wraps to 32 bits", "set k 0 4294967297 1\r\nx\r\n", Request{Op: OpSet, Key: []byte("k"), Exptime: 1, Value: []byte("x")}},
		{"add", "add k 1 2 1\r\nx\r\n", Request{Op: OpAdd, Key: []byte("k"), Flags: 1, Exptime: 2, Value: []byte("x")}},
		{"replace", "replace k 0 0 1\r\nx\r\n", Request{Op: OpReplace, Key: []byte("k"), Value: []byte("x")}},
		{"append", "append k 0 0 1\r\nx\r\n", Request{Op: OpAppend, Key: []byte("k"), Value: []byte("x")}},
		{"prepend noreply", "prepend k 0 0 1 noreply\r\nx\r\n", Request{Op: OpPrepend, Key: []byte("k"), Value: []byte("x"), NoReply: true}},
		{"cas", "cas k 1 2 1 99\r\nx\r\n", Request{Op: OpCas, Key: []byte("k"), Flags: 1, Exptime: 2, Cas: 99, Value: []byte("x")}},
		{"cas noreply", "cas k 0 0 1 18446744073709551615 noreply\r\nx\r\n", Request{Op: OpCas, Key: []byte("k"), Cas: 1<<64 - 1, Value: []byte("x"), NoReply: true}},
		{"delete", "delete k\r\n", Request{Op: OpDelete, Key: []byte("k")}},
		{"delete noreply", "delete k noreply\r\n", Request{Op: OpDelete, Key: []byte("k"), NoReply: true}},
		{"delete legacy zero", "delete k 0\r\n", Request{Op: OpDelete, Key: []byte("k")}},
		{"delete legacy zero noreply", "delete k 0 noreply\r\n", Request{Op: OpDelete, Key: []byte("k"), NoReply: true}},
		{"incr", "incr k 5\r\n", Request{Op: OpIncr, Key: []byte("k"), Delta: 5}},
		{"incr max delta", "incr k 18446744073709551615\r\n", Request{Op: OpIncr, Key: []byte("k"), Delta: 1<<64 - 1}},
		{"incr extra token ignored", "incr k 5 6\r\n", Request{Op: OpIncr, Key: []byte("k"), Delta: 5}},
		{"decr noreply", "decr k 007 noreply\r\n", Request{Op: OpDecr, Key: []byte("k"), Delta: 7, NoReply: true}},
		{"touch", "touch k 60\r\n", Request{Op: OpTouch, Key: []byte("k"), Exptime: 60}},
		{"touch noreply", "touch k -1 noreply\r\n", Request{Op: OpTouch, Key: []byte("k"), Exptime: -1, NoReply: true}},
		{"flush_all", "flush_all\r\n", Request{Op: OpFlushAll}},
		{"flush_all delay", "flush_all 30\r\n", Request{Op: OpFlushAll, Exptime: 30}},
		{"flush_all noreply", "flush_all noreply\r\n", Request{Op: OpFlushAll, NoReply: true}},
		{"flush_all delay noreply", "flush_all 30 noreply\r\n", Request{Op: OpFlushAll, Exptime: 30, NoReply: true}},
		{"flush_all extra token ignored", "flush_all 0 0\r\n", Request{Op: OpFlushAll}},
		{"version", "version\r\n", Request{Op: OpVersion}},
		{"version extra", "version x\r\n", Request{Op: OpVersion}},
		{"verbosity", "verbosity 1\r\n", Request{Op: OpVerbosity, Level: 1}},
		{"verbosity noreply", "verbosity 2 noreply\r\n", Request{Op: OpVerbosity, Level: 2, NoReply: true}},
		{"stats", "stats\r\n", Request{Op: OpStats}},
		{"stats args", "stats  detail dump \r\n", Request{Op: OpStats, Args: []byte("detail dump")}},
		{"stats proxy", "stats proxy\r\n", Request{Op: OpStats, Args: []byte("proxy")}},
		{"quit", "quit\r\n", Request{Op: OpQuit}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, size := range []int{16, 4096} {
				d := textReaderOf(tt.in, size, DefaultLimits())
				var req Request
				if err := d.Read(&req); err != nil {
					t.Fatalf("buffer %d: Read: %v", size, err)
				}
				if got, want := textReqString(&req), textReqString(&tt.want); got != want {
					t.Errorf("buffer %d:\n got %s\nwant %s", size, got, want)
				}
				if err := d.Read(&req); err != io.EOF {
					t.Errorf("buffer %d: Read after the request = %v, want io.EOF", size, err)
				}
				// What was decoded, encoded again, decodes the same.
				again := textReaderOf(string(AppendTextRequest(nil, &tt.want)), size, DefaultLimits())
				var req2 Request
				if err := again.Read(&req2); err != nil {
					t.Fatalf("buffer %d: Read(AppendTextRequest): %v", size, err)
				}
				if got, want := textReqString(&req2), textReqString(&tt.want); got != want {
					t.Errorf("buffer %d: round trip:\n got %s\nwant %s", size, got, want)
				}
			}
		})
	}
}

func TestTextAppendRequest(t *testing.T) {
	tests := []struct {
		name string
		req  Request
		want string
	}{
		{"get", Request{Op: OpGet, Keys: textKeys("a", "b")}, "get a b\r\n"},
		{"gats", Request{Op: OpGats, Exptime: -1, Keys: textKeys("a")}, "gats -1 a\r\n"},
		{"set", Request{Op: OpSet, Key: []byte("k"), Flags: 3, Exptime: 4, Value: []byte("xy")}, "set k 3 4 2\r\nxy\r\n"},
		{"cas noreply", Request{Op: OpCas, Key: []byte("k"), Cas: 7, Value: []byte("x"), NoReply: true}, "cas k 0 0 1 7 noreply\r\nx\r\n"},
		{"delete", Request{Op: OpDelete, Key: []byte("k")}, "delete k\r\n"},
		{"incr noreply", Request{Op: OpIncr, Key: []byte("k"), Delta: 9, NoReply: true}, "incr k 9 noreply\r\n"},
		{"touch", Request{Op: OpTouch, Key: []byte("k"), Exptime: 5}, "touch k 5\r\n"},
		{"flush_all", Request{Op: OpFlushAll}, "flush_all\r\n"},
		{"flush_all delay noreply", Request{Op: OpFlushAll, Exptime: 9, NoReply: true}, "flush_all 9 noreply\r\n"},
		{"verbosity", Request{Op: OpVerbosity, Level: 1}, "verbosity 1\r\n"},
		{"stats args", Request{Op: OpStats, Args: []byte("slabs")}, "stats slabs\r\n"},
		{"version", Request{Op: OpVersion}, "version\r\n"},
		{"quit", Request{Op: OpQuit}, "quit\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(AppendTextRequest([]byte("prev"), &tt.req)); got != "prev"+tt.want {
				t.Errorf("got %q, want %q", got, "prev"+tt.want)
			}
		})
	}
}

func TestTextAppendResponse(t *testing.T) {
	hit := func(key, val string, flags uint32, cas uint64) Response {
		return Response{Status: StatusOK, Key: []byte(key), Value: []byte(val), Flags: flags, Cas: cas}
	}
	miss := func(key string) Response { return Response{Status: StatusNotFound, Key: []byte(key)} }
	one := func(r Response) []Response { return []Response{r} }
	tests := []struct {
		name  string
		req   Request
		resps []Response
		want  string
	}{
		{"get hit", Request{Op: OpGet, Keys: textKeys("a")}, one(hit("a", "xyz", 7, 99)), "VALUE a 7 3\r\nxyz\r\nEND\r\n"},
		{"get miss", Request{Op: OpGet, Keys: textKeys("a")}, one(miss("a")), "END\r\n"},
		{"get no keys", Request{Op: OpGat}, nil, "END\r\n"},
		{"get hits in request order", Request{Op: OpGet, Keys: textKeys("b", "a", "c")},
			[]Response{hit("b", "2", 0, 0), miss("a"), hit("c", "3", 1, 0)}, "VALUE b 0 1\r\n2\r\nVALUE c 1 1\r\n3\r\nEND\r\n"},
		{"get key from request", Request{Op: OpGet, Keys: textKeys("a")}, one(Response{Status: StatusOK, Value: []byte("v")}), "VALUE a 0 1\r\nv\r\nEND\r\n"},
		{"gets cas", Request{Op: OpGets, Keys: textKeys("a")}, one(hit("a", "", 0, 12)), "VALUE a 0 0 12\r\n\r\nEND\r\n"},
		{"gats cas", Request{Op: OpGats, Keys: textKeys("a")}, one(hit("a", "v", 0, 1)), "VALUE a 0 1 1\r\nv\r\nEND\r\n"},
		{"gat no cas", Request{Op: OpGat, Keys: textKeys("a")}, one(hit("a", "v", 0, 1)), "VALUE a 0 1\r\nv\r\nEND\r\n"},
		{"get failure is not a miss", Request{Op: OpGet, Keys: textKeys("a", "b")},
			[]Response{hit("a", "1", 0, 0), {Status: StatusTempFailure, Key: []byte("b"), Msg: "backend timeout"}}, "SERVER_ERROR backend timeout\r\n"},
		{"stored", Request{Op: OpSet}, one(Response{}), "STORED\r\n"},
		{"cas stored", Request{Op: OpCas}, one(Response{}), "STORED\r\n"},
		{"not stored", Request{Op: OpAdd}, one(Response{Status: StatusNotStored}), "NOT_STORED\r\n"},
		{"exists", Request{Op: OpCas}, one(Response{Status: StatusExists}), "EXISTS\r\n"},
		{"cas not found", Request{Op: OpCas}, one(Response{Status: StatusNotFound}), "NOT_FOUND\r\n"},
		{"too large", Request{Op: OpSet}, one(Response{Status: StatusTooLarge}), "SERVER_ERROR object too large for cache\r\n"},
		{"no memory", Request{Op: OpSet}, one(Response{Status: StatusNoMemory}), "SERVER_ERROR out of memory storing object\r\n"},
		{"deleted", Request{Op: OpDelete}, one(Response{}), "DELETED\r\n"},
		{"delete miss", Request{Op: OpDelete}, one(Response{Status: StatusNotFound}), "NOT_FOUND\r\n"},
		{"incr", Request{Op: OpIncr}, one(Response{Number: 18446744073709551615}), "18446744073709551615\r\n"},
		{"decr to zero", Request{Op: OpDecr}, one(Response{}), "0\r\n"},
		{"incr non-numeric", Request{Op: OpIncr}, one(Response{Status: StatusNonNumeric}), "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"},
		{"touched", Request{Op: OpTouch}, one(Response{}), "TOUCHED\r\n"},
		{"flush_all", Request{Op: OpFlushAll}, one(Response{}), "OK\r\n"},
		{"verbosity", Request{Op: OpVerbosity}, one(Response{}), "OK\r\n"},
		{"version", Request{Op: OpVersion}, one(Response{Value: []byte("1.2.3")}), "VERSION 1.2.3\r\n"},
		{"stats", Request{Op: OpStats}, one(Response{Stats: []Stat{{"pid", "1"}, {"uptime", "2"}}}), "STAT pid 1\r\nSTAT uptime 2\r\nEND\r\n"},
		{"invalid", Request{Op: OpSet}, one(Response{Status: StatusInvalid, Msg: "bad"}), "CLIENT_ERROR bad\r\n"},
		{"unknown", Request{Op: OpSet}, one(Response{Status: StatusUnknownCommand}), "ERROR\r\n"},
		{"temp failure", Request{Op: OpDelete}, one(Response{Status: StatusTempFailure, Msg: "no server"}), "SERVER_ERROR no server\r\n"},
		{"missing response", Request{Op: OpDelete}, nil, "SERVER_ERROR no answer\r\n"},
		{"noreply", Request{Op: OpSet, NoReply: true}, one(Response{}), ""},
		{"noreply error", Request{Op: OpSet, NoReply: true}, one(Response{Status: StatusTempFailure, Msg: "x"}), ""},
		{"quit", Request{Op: OpQuit}, one(Response{}), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(AppendTextResponse([]byte("prev"), &tt.req, tt.resps)); got != "prev"+tt.want {
				t.Errorf("got %q, want %q", got, "prev"+tt.want)
			}
		})
	}
}

func TestTextAppendError(t *testing.T) {
	tests := []struct {
		name string
		err  RequestError
		want string
	}{
		{"unknown", RequestError{Status: StatusUnknownCommand}, "ERROR\r\n"},
		{"client", RequestError{Status: StatusInvalid, Msg: "bad data chunk"}, "CLIENT_ERROR bad data chunk\r\n"},
		{"too large", RequestError{Status: StatusTooLarge, Msg: "object too large for cache"}, "SERVER_ERROR object too large for cache\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(AppendTextError(nil, &tt.err)); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
			if got := tt.err.Error() + "\r\n"; got != tt.want {
				t.Errorf("Error() = %q, disagrees with AppendTextError %q", got, tt.want)
			}
		})
	}
}

// TestTextPipeline decodes a stream of many requests written back to back, through a small
// buffer so lines and data blocks straddle its boundaries.
func TestTextPipeline(t *testing.T) {
	var reqs []Request
	for i := range 500 {
		k := []byte(fmt.Sprintf("key:%d", i))
		switch i % 6 {
		case 0:
			reqs = append(reqs, Request{Op: OpGet, Keys: [][]byte{k, []byte("other")}})
		case 1:
			reqs = append(reqs, Request{Op: OpSet, Key: k, Flags: uint32(i), Value: bytes.Repeat([]byte{'v'}, i)})
		case 2:
			reqs = append(reqs, Request{Op: OpIncr, Key: k, Delta: uint64(i), NoReply: true})
		case 3:
			reqs = append(reqs, Request{Op: OpCas, Key: k, Cas: uint64(i), Value: []byte("x\r\ny")})
		case 4:
			reqs = append(reqs, Request{Op: OpDelete, Key: k})
		case 5:
			reqs = append(reqs, Request{Op: OpGats, Exptime: int64(i), Keys: [][]byte{k}})
		}
	}
	var stream []byte
	for i := range reqs {
		stream = AppendTextRequest(stream, &reqs[i])
	}
	for _, size := range []int{16, 100, 4096} {
		d := textReaderOf(string(stream), size, DefaultLimits())
		var req Request
		for i := range reqs {
			if err := d.Read(&req); err != nil {
				t.Fatalf("buffer %d: request %d: %v", size, i, err)
			}
			if got, want := textReqString(&req), textReqString(&reqs[i]); got != want {
				t.Fatalf("buffer %d: request %d:\n got %s\nwant %s", size, i, got, want)
			}
		}
		if err := d.Read(&req); err != io.EOF {
			t.Fatalf("buffer %d: after the stream: %v, want io.EOF", size, err)
		}
	}
}

// TestTextLongMultiget reads a get line far longer than the bufio buffer and MaxLineBytes.
func TestTextLongMultiget(t *testing.T) {
	var keys []string
	for i := range 2000 {
		keys = append(keys, fmt.Sprintf("some:long:key:%06d", i))
	}
	line := "get " + strings.Join(keys, " ") + "\r\nversion\r\n"
	for _, size := range []int{16, 4096} {
		d := textReaderOf(line, size, DefaultLimits())
		var req Request
		if err := d.Read(&req); err != nil {
			t.Fatalf("buffer %d: %v", size, err)
		}
		if len(req.Keys) != len(keys) {
			t.Fatalf("buffer %d: %d keys, want %d", size, len(req.Keys), len(keys))
		}
		for i, k := range req.Keys {
			if string(k) != keys[i] {
				t.Fatalf("buffer %d: key %d = %q, want %q", size, i, k, keys[i])
			}
		}
		if err := d.Read(&req); err != nil || req.Op != OpVersion {
			t.Fatalf("buffer %d: next request %v, %v; want version", size, req.Op, err)
		}
	}
}

// TestTextLimits checks each limit at its edge, with Limits smaller than the defaults.
func TestTextLimits(t *testing.T) {
	lim := Limits{MaxKeyBytes: 4, MaxValueBytes: 8, MaxMultigetKeys: 3, MaxLineBytes: 32}
	tests := []struct {
		name    string
		in      string
		wantErr string // "" accepts
	}{
		{"key at limit", "get abcd\r\n", ""},
		{"key over limit", "get abcde\r\n", "CLIENT_ERROR bad command line format"},
		{"storage key over limit", "set abcde 0 0 1\r\n", "CLIENT_ERROR bad command line format"},
		{"keys at limit", "get a b c\r\n", ""},
		{"keys over limit", "get a b c d\r\n", "CLIENT_ERROR bad command line format"},
		{"value at limit", "set k 0 0 8\r\n12345678\r\n", ""},
		{"value over limit", "set k 0 0 9\r\n123456789\r\n", "SERVER_ERROR object too large for cache"},
		{"line at limit", "verbosity 1" + strings.Repeat(" ", 21) + "\r\n", ""},
		{"line over limit", "verbosity 1" + strings.Repeat(" ", 22) + "\r\n", ErrLineTooLong.Error()},
		{"retrieval line over its limit", "get " + strings.Repeat("a ", 50) + "\r\n", "CLIENT_ERROR bad command line format"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, size := range []int{16, 4096} {
				d := textReaderOf(tt.in, size, lim)
				var req Request
				err := d.Read(&req)
				got := ""
				if err != nil {
					got = err.Error()
				}
				if got != tt.wantErr {
					t.Errorf("buffer %d: got error %q, want %q", size, got, tt.wantErr)
				}
			}
		})
	}
}

// TestTextHugeLengthNotAllocated sends a data length of a gigabyte and no data: the answer
// comes at once, without waiting for or allocating the block.
func TestTextHugeLengthNotAllocated(t *testing.T) {
	in := "set k 0 0 1000000000\r\n"
	var req Request
	allocs := testing.AllocsPerRun(10, func() {
		d := textReaderOf(in, 64, DefaultLimits())
		err := d.Read(&req)
		var re *RequestError
		if !errors.As(err, &re) || re.Status != StatusTooLarge {
			t.Fatalf("Read = %v, want object too large", err)
		}
		// The block is swallowed before the next request; here the stream ends inside it.
		if err := d.Read(&req); err != io.ErrUnexpectedEOF {
			t.Fatalf("next Read = %v, want io.ErrUnexpectedEOF", err)
		}
	})
	if allocs > 10 {
		t.Errorf("%v allocations per run, want a handful (no buffer for the data)", allocs)
	}
}

// TestTextScratchReleased checks that a value too big for the bufio buffer is read into
// scratch that is dropped before the next request when it is over 64 KiB.
func TestTextScratchReleased(t *testing.T) {
	big := strings.Repeat("v", 100<<10)
	in := "set k 0 0 " + fmt.Sprint(len(big)) + "\r\n" + big + "\r\nget " + strings.Repeat("kkkkkkkkk ", 9000) + "\r\nversion\r\n"
	d := textReaderOf(in, 4096, DefaultLimits())
	var req Request
	if err := d.Read(&req); err != nil || string(req.Value) != big {
		t.Fatalf("set: %v (value %d bytes)", err, len(req.Value))
	}
	if err := d.Read(&req); err != nil || len(req.Keys) != 9000 {
		t.Fatalf("get: %v (%d keys)", err, len(req.Keys))
	}
	if d.value != nil {
		t.Errorf("value scratch of %d bytes kept after the next request", cap(d.value))
	}
	if err := d.Read(&req); err != nil || req.Op != OpVersion {
		t.Fatalf("version: %v", err)
	}
	if d.line != nil {
		t.Errorf("line scratch of %d bytes kept after the next request", cap(d.line))
	}
}

// TestTextReset reuses a reader on another stream, mid-way through a swallowed block.
func TestTextReset(t *testing.T) {
	d := textReaderOf("set k 0 0 2000000\r\n", 0, DefaultLimits())
	var req Request
	if err := d.Read(&req); err == nil {
		t.Fatal("oversized set accepted")
	}
	d.Reset(bufio.NewReader(strings.NewReader("version\r\n")))
	if err := d.Read(&req); err != nil || req.Op != OpVersion {
		t.Fatalf("after Reset: %v %v, want version", req.Op, err)
	}
}
