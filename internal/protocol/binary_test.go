package protocol

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"reflect"
	"testing"
	"testing/iotest"
)

// binPacket is a packet built field by field, independently of the codec under test.
// keyLen, extLen and bodyLen override the lengths derived from the contents when >= 0.
type binPacket struct {
	magic, opcode           uint8
	status                  uint16
	opaque                  uint32
	cas                     uint64
	ext, key, value         []byte
	keyLen, extLen, bodyLen int
}

func (p binPacket) bytes() []byte {
	kl, el, bl := len(p.key), len(p.ext), len(p.ext)+len(p.key)+len(p.value)
	if p.keyLen >= 0 {
		kl = p.keyLen
	}
	if p.extLen >= 0 {
		el = p.extLen
	}
	if p.bodyLen >= 0 {
		bl = p.bodyLen
	}
	b := []byte{p.magic, p.opcode, byte(kl >> 8), byte(kl), byte(el), 0}
	b = binary.BigEndian.AppendUint16(b, p.status)
	b = binary.BigEndian.AppendUint32(b, uint32(bl))
	b = binary.BigEndian.AppendUint32(b, p.opaque)
	b = binary.BigEndian.AppendUint64(b, p.cas)
	b = append(b, p.ext...)
	b = append(b, p.key...)
	return append(b, p.value...)
}

// binReq is a well-formed request packet.
func binReq(opcode uint8, opaque uint32, cas uint64, ext, key, value []byte) []byte {
	return binPacket{magic: 0x80, opcode: opcode, opaque: opaque, cas: cas, ext: ext, key: key, value: value, keyLen: -1, extLen: -1, bodyLen: -1}.bytes()
}

// binResp is a well-formed response packet.
func binResp(opcode uint8, status uint16, opaque uint32, cas uint64, ext, key, value []byte) []byte {
	return binPacket{magic: 0x81, opcode: opcode, status: status, opaque: opaque, cas: cas, ext: ext, key: key, value: value, keyLen: -1, extLen: -1, bodyLen: -1}.bytes()
}

func binU32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func binExt(vs ...uint64) []byte {
	var b []byte
	for i := 0; i < len(vs); i += 2 {
		if vs[i+1] == 4 {
			b = binary.BigEndian.AppendUint32(b, uint32(vs[i]))
		} else {
			b = binary.BigEndian.AppendUint64(b, vs[i])
		}
	}
	return b
}

// binRequestsEqual compares two requests treating nil and empty byte slices alike.
func binRequestsEqual(a, b *Request) bool {
	if len(a.Keys) != len(b.Keys) {
		return false
	}
	for i := range a.Keys {
		if !bytes.Equal(a.Keys[i], b.Keys[i]) {
			return false
		}
	}
	x, y := *a, *b
	if !bytes.Equal(x.Key, y.Key) || !bytes.Equal(x.Value, y.Value) || !bytes.Equal(x.Args, y.Args) {
		return false
	}
	x.Keys, y.Keys, x.Key, y.Key, x.Value, y.Value, x.Args, y.Args = nil, nil, nil, nil, nil, nil, nil, nil
	return reflect.DeepEqual(x, y)
}

func binFormatRequest(r *Request) string {
	return fmt.Sprintf("%+v keys=%q key=%q value=%q args=%q", *r, r.Keys, r.Key, r.Value, r.Args)
}

func TestBinaryReadEveryOpcode(t *testing.T) {
	k := []byte("key")
	tests := []struct {
		name string
		in   []byte
		want Request
	}{
		{"get", binReq(0x00, 7, 0, nil, k, nil), Request{Op: OpGet, Keys: [][]byte{k}}},
		{"getq", binReq(0x09, 7, 0, nil, k, nil), Request{Op: OpGet, Keys: [][]byte{k}, Quiet: true}},
		{"getk", binReq(0x0c, 7, 0, nil, k, nil), Request{Op: OpGet, Keys: [][]byte{k}, WithKey: true}},
		{"getkq", binReq(0x0d, 7, 0, nil, k, nil), Request{Op: OpGet, Keys: [][]byte{k}, Quiet: true, WithKey: true}},
		{"gat", binReq(0x1d, 7, 0, binU32(100), k, nil), Request{Op: OpGat, Keys: [][]byte{k}, Exptime: 100}},
		{"gatq", binReq(0x1e, 7, 0, binU32(100), k, nil), Request{Op: OpGat, Keys: [][]byte{k}, Exptime: 100, Quiet: true}},
		{"gatk", binReq(0x23, 7, 0, binU32(100), k, nil), Request{Op: OpGat, Keys: [][]byte{k}, Exptime: 100, WithKey: true}},
		{"gatkq", binReq(0x24, 7, 0, binU32(100), k, nil), Request{Op: OpGat, Keys: [][]byte{k}, Exptime: 100, Quiet: true, WithKey: true}},
		{"set", binReq(0x01, 7, 0, binExt(42, 4, 300, 4), k, []byte("val")), Request{Op: OpSet, Key: k, Value: []byte("val"), Flags: 42, Exptime: 300}},
		{"set with cas is cas", binReq(0x01, 7, 99, binExt(42, 4, 300, 4), k, []byte("val")), Request{Op: OpCas, Key: k, Value: []byte("val"), Flags: 42, Exptime: 300, Cas: 99}},
		{"setq", binReq(0x11, 7, 0, binExt(0, 4, 0, 4), k, []byte("val")), Request{Op: OpSet, Key: k, Value: []byte("val"), Quiet: true}},
		{"set empty value", binReq(0x01, 7, 0, binExt(0, 4, 0, 4), k, nil), Request{Op: OpSet, Key: k}},
		{"set exptime over 2^31", binReq(0x01, 7, 0, binExt(0, 4, 0xfffffff0, 4), k, nil), Request{Op: OpSet, Key: k, Exptime: 0xfffffff0}},
		{"add", binReq(0x02, 7, 0, binExt(1, 4, 2, 4), k, []byte("v")), Request{Op: OpAdd, Key: k, Value: []byte("v"), Flags: 1, Exptime: 2}},
		{"addq", binReq(0x12, 7, 0, binExt(1, 4, 2, 4), k, []byte("v")), Request{Op: OpAdd, Key: k, Value: []byte("v"), Flags: 1, Exptime: 2, Quiet: true}},
		{"replace with cas", binReq(0x03, 7, 5, binExt(1, 4, 2, 4), k, []byte("v")), Request{Op: OpReplace, Key: k, Value: []byte("v"), Flags: 1, Exptime: 2, Cas: 5}},
		{"replaceq", binReq(0x13, 7, 0, binExt(1, 4, 2, 4), k, []byte("v")), Request{Op: OpReplace, Key: k, Value: []byte("v"), Flags: 1, Exptime: 2, Quiet: true}},
		{"append", binReq(0x0e, 7, 0, nil, k, []byte("tail")), Request{Op: OpAppend, Key: k, Value: []byte("tail")}},
		{"appendq with cas", binReq(0x19, 7, 3, nil, k, []byte("tail")), Request{Op: OpAppend, Key: k, Value: []byte("tail"), Cas: 3, Quiet: true}},
		{"prepend", binReq(0x0f, 7, 0, nil, k, []byte("head")), Request{Op: OpPrepend, Key: k, Value: []byte("head")}},
		{"prependq", binReq(0x1a, 7, 0, nil, k, []byte("head")), Request{Op: OpPrepend, Key: k, Value: []byte("head"), Quiet: true}},
		{"delete", binReq(0x04, 7, 0, nil, k, nil), Request{Op: OpDelete, Key: k}},
		{"deleteq with cas", binReq(0x14, 7, 8, nil, k, nil), Request{Op: OpDelete, Key: k, Cas: 8, Quiet: true}},
		{"incr create", binReq(0x05, 7, 0, binExt(5, 8, 10, 8, 0, 4), k, nil), Request{Op: OpIncr, Key: k, Delta: 5, Initial: 10, Create: true}},
		{"incr no create", binReq(0x05, 7, 0, binExt(5, 8, 10, 8, 0xffffffff, 4), k, nil), Request{Op: OpIncr, Key: k, Delta: 5, Initial: 10, Exptime: 0xffffffff}},
		{"incrq", binReq(0x15, 7, 0, binExt(1, 8, 0, 8, 60, 4), k, nil), Request{Op: OpIncr, Key: k, Delta: 1, Exptime: 60, Create: true, Quiet: true}},
		{"decr", binReq(0x06, 7, 0, binExt(1, 8, 0, 8, 60, 4), k, nil), Request{Op: OpDecr, Key: k, Delta: 1, Exptime: 60, Create: true}},
		{"decrq with cas", binReq(0x16, 7, 4, binExt(1, 8, 0, 8, 60, 4), k, nil), Request{Op: OpDecr, Key: k, Delta: 1, Exptime: 60, Create: true, Quiet: true, Cas: 4}},
		{"quit", binReq(0x07, 7, 0, nil, nil, nil), Request{Op: OpQuit}},
		{"quitq", binReq(0x17, 7, 0, nil, nil, nil), Request{Op: OpQuit, Quiet: true}},
		{"flush", binReq(0x08, 7, 0, nil, nil, nil), Request{Op: OpFlushAll}},
		{"flush delay", binReq(0x08, 7, 0, binU32(30), nil, nil), Request{Op: OpFlushAll, Exptime: 30}},
		{"flushq", binReq(0x18, 7, 0, nil, nil, nil), Request{Op: OpFlushAll, Quiet: true}},
		{"noop", binReq(0x0a, 7, 0, nil, nil, nil), Request{Op: OpNoop}},
		{"version", binReq(0x0b, 7, 0, nil, nil, nil), Request{Op: OpVersion}},
		{"stat", binReq(0x10, 7, 0, nil, nil, nil), Request{Op: OpStats}},
		{"stat settings", binReq(0x10, 7, 0, nil, []byte("settings"), nil), Request{Op: OpStats, Args: []byte("settings")}},
		{"verbosity", binReq(0x1b, 7, 0, binU32(2), nil, nil), Request{Op: OpVerbosity, Level: 2}},
		{"touch", binReq(0x1c, 7, 0, binU32(10), k, nil), Request{Op: OpTouch, Key: k, Exptime: 10}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := tt.want
			want.Binary, want.Opcode, want.Opaque = true, tt.in[1], 7
			d := NewBinaryReader(bufio.NewReader(bytes.NewReader(tt.in)), DefaultLimits())
			var got Request
			if err := d.Read(&got); err != nil {
				t.Fatalf("Read: %v", err)
			}
			if !binRequestsEqual(&got, &want) {
				t.Fatalf("Read:\n got %s\nwant %s", binFormatRequest(&got), binFormatRequest(&want))
			}
			if err := d.Read(&got); err != io.EOF {
				t.Fatalf("second Read = %v, want io.EOF", err)
			}
			if enc := AppendBinaryRequest(nil, &want); !bytes.Equal(enc, tt.in) {
				t.Fatalf("AppendBinaryRequest:\n got % x\nwant % x", enc, tt.in)
			}
		})
	}
}

func TestBinaryAppendRequestFromText(t *testing.T) {
	k1, k2 := []byte("a"), []byte("bb")
	tests := []struct {
		name string
		req  Request
		want []byte
	}{
		{"gets two keys with getkq", Request{Op: OpGets, Keys: [][]byte{k1, k2}, Quiet: true, WithKey: true, Opaque: 3},
			append(binReq(0x0d, 3, 0, nil, k1, nil), binReq(0x0d, 3, 0, nil, k2, nil)...)},
		{"gats", Request{Op: OpGats, Keys: [][]byte{k1}, Exptime: 9}, binReq(0x1d, 0, 0, binU32(9), k1, nil)},
		{"cas is set with cas", Request{Op: OpCas, Key: k1, Value: []byte("v"), Cas: 77, Flags: 1}, binReq(0x01, 0, 77, binExt(1, 4, 0, 4), k1, []byte("v"))},
		{"negative exptime expires at once", Request{Op: OpSet, Key: k1, Exptime: -1}, binReq(0x01, 0, 0, binExt(0, 4, 2592001, 4), k1, nil)},
		{"huge exptime clamps", Request{Op: OpTouch, Key: k1, Exptime: 1 << 40}, binReq(0x1c, 0, 0, binU32(0xffffffff), k1, nil)},
		{"text incr does not create", Request{Op: OpIncr, Key: k1, Delta: 2}, binReq(0x05, 0, 0, binExt(2, 8, 0, 8, 0xffffffff, 4), k1, nil)},
		{"stats args", Request{Op: OpStats, Args: []byte("slabs")}, binReq(0x10, 0, 0, nil, []byte("slabs"), nil)},
		{"flush_all delay", Request{Op: OpFlushAll, Exptime: 5, Quiet: true}, binReq(0x18, 0, 0, binU32(5), nil, nil)},
		{"invalid appends nothing", Request{Op: OpInvalid}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := AppendBinaryRequest(nil, &tt.req); !bytes.Equal(got, tt.want) {
				t.Fatalf("got % x\nwant % x", got, tt.want)
			}
		})
	}
}

func TestBinaryAppendResponse(t *testing.T) {
	k := []byte("key")
	req := func(opcode uint8) *Request {
		r := &Request{Binary: true, Opcode: opcode, Opaque: 0x01020304}
		c := binCommands[opcode]
		r.Op, r.Quiet, r.WithKey = c.op, c.quiet, c.withKey
		if c.op.IsRetrieval() {
			r.Keys = [][]byte{k}
		} else {
			r.Key = k
		}
		return r
	}
	const opq = 0x01020304
	hit := Response{Status: StatusOK, Value: []byte("hello"), Flags: 42, Cas: 3}
	tests := []struct {
		name string
		req  *Request
		resp Response
		want []byte
	}{
		{"get hit", req(0x00), hit, binResp(0x00, 0, opq, 3, binU32(42), nil, []byte("hello"))},
		{"get miss", req(0x00), Response{Status: StatusNotFound}, binResp(0x00, 1, opq, 0, nil, nil, []byte("Not found"))},
		{"getq hit", req(0x09), hit, binResp(0x09, 0, opq, 3, binU32(42), nil, []byte("hello"))},
		{"getk hit", req(0x0c), hit, binResp(0x0c, 0, opq, 3, binU32(42), k, []byte("hello"))},
		{"getk miss carries key", req(0x0c), Response{Status: StatusNotFound}, binResp(0x0c, 1, opq, 0, nil, k, nil)},
		{"getkq hit", req(0x0d), hit, binResp(0x0d, 0, opq, 3, binU32(42), k, []byte("hello"))},
		{"gat hit", req(0x1d), hit, binResp(0x1d, 0, opq, 3, binU32(42), nil, []byte("hello"))},
		{"gatk miss", req(0x23), Response{Status: StatusNotFound}, binResp(0x23, 1, opq, 0, nil, k, nil)},
		{"touch hit has flags only", req(0x1c), hit, binResp(0x1c, 0, opq, 3, binU32(42), nil, nil)},
		{"touch miss", req(0x1c), Response{Status: StatusNotFound}, binResp(0x1c, 1, opq, 0, nil, nil, []byte("Not found"))},
		{"set stored", req(0x01), Response{Cas: 9}, binResp(0x01, 0, opq, 9, nil, nil, nil)},
		{"set exists", req(0x01), Response{Status: StatusExists}, binResp(0x01, 2, opq, 0, nil, nil, []byte("Data exists for key."))},
		{"add not stored is exists", req(0x02), Response{Status: StatusNotStored}, binResp(0x02, 2, opq, 0, nil, nil, []byte("Data exists for key."))},
		{"addq not stored is exists", req(0x12), Response{Status: StatusNotStored}, binResp(0x12, 2, opq, 0, nil, nil, []byte("Data exists for key."))},
		{"replace not stored is not found", req(0x03), Response{Status: StatusNotStored}, binResp(0x03, 1, opq, 0, nil, nil, []byte("Not found"))},
		{"append not stored", req(0x0e), Response{Status: StatusNotStored}, binResp(0x0e, 5, opq, 0, nil, nil, []byte("Not stored."))},
		{"set too large", req(0x01), Response{Status: StatusTooLarge}, binResp(0x01, 3, opq, 0, nil, nil, []byte("Too large."))},
		{"set out of memory", req(0x01), Response{Status: StatusNoMemory}, binResp(0x01, 0x82, opq, 0, nil, nil, []byte("Out of memory"))},
		{"delete", req(0x04), Response{}, binResp(0x04, 0, opq, 0, nil, nil, nil)},
		{"deleteq miss", req(0x14), Response{Status: StatusNotFound}, binResp(0x14, 1, opq, 0, nil, nil, []byte("Not found"))},
		{"incr", req(0x05), Response{Number: 15, Cas: 5}, binResp(0x05, 0, opq, 5, nil, nil, binExt(15, 8))},
		{"decr non-numeric", req(0x06), Response{Status: StatusNonNumeric}, binResp(0x06, 6, opq, 0, nil, nil, []byte("Non-numeric server-side value for incr or decr"))},
		{"version", req(0x0b), Response{Value: []byte("1.2.3")}, binResp(0x0b, 0, opq, 0, nil, nil, []byte("1.2.3"))},
		{"noop", req(0x0a), Response{}, binResp(0x0a, 0, opq, 0, nil, nil, nil)},
		{"quit", req(0x07), Response{}, binResp(0x07, 0, opq, 0, nil, nil, nil)},
		{"flush", req(0x08), Response{}, binResp(0x08, 0, opq, 0, nil, nil, nil)},
		{"verbosity", req(0x1b), Response{}, binResp(0x1b, 0, opq, 0, nil, nil, nil)},
		{"stat", req(0x10), Response{Stats: []Stat{{"pid", "12"}, {"uptime", "3"}}},
			bytes.Join([][]byte{binResp(0x10, 0, opq, 0, nil, []byte("pid"), []byte("12")), binResp(0x10, 0, opq, 0, nil, []byte("uptime"), []byte("3")), binResp(0x10, 0, opq, 0, nil, nil, nil)}, nil)},
		{"stat unknown group", req(0x10), Response{Status: StatusNotFound}, binResp(0x10, 1, opq, 0, nil, nil, []byte("Not found"))},
		{"temporary failure with reason", req(0x00), Response{Status: StatusTempFailure, Msg: "backend timeout"}, binResp(0x00, 0x86, opq, 0, nil, nil, []byte("backend timeout"))},
		{"temporary failure default text", req(0x01), Response{Status: StatusTempFailure}, binResp(0x01, 0x86, opq, 0, nil, nil, []byte("Temporary failure"))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := []byte("prefix")
			got := AppendBinaryResponse(prefix, tt.req, &tt.resp)
			if !bytes.Equal(got[:len(prefix)], prefix) || !bytes.Equal(got[len(prefix):], tt.want) {
				t.Fatalf("got % x\nwant % x", got[len(prefix):], tt.want)
			}
		})
	}
}

func TestBinaryQuietSuppression(t *testing.T) {
	statuses := []Status{StatusOK, StatusNotFound, StatusExists, StatusNotStored, StatusNonNumeric, StatusTooLarge, StatusInvalid, StatusTempFailure}
	tests := []struct {
		name       string
		opcode     uint8
		suppressed []Status // the statuses that give no answer
	}{
		{"get", 0x00, nil},
		{"getq", 0x09, []Status{StatusNotFound}},
		{"getkq", 0x0d, []Status{StatusNotFound}},
		{"gatq", 0x1e, []Status{StatusNotFound}},
		{"gatkq", 0x24, []Status{StatusNotFound}},
		{"set", 0x01, nil},
		{"setq", 0x11, []Status{StatusOK}},
		{"addq", 0x12, []Status{StatusOK}},
		{"replaceq", 0x13, []Status{StatusOK}},
		{"appendq", 0x19, []Status{StatusOK}},
		{"prependq", 0x1a, []Status{StatusOK}},
		{"deleteq", 0x14, []Status{StatusOK}},
		{"incrq", 0x15, []Status{StatusOK}},
		{"decrq", 0x16, []Status{StatusOK}},
		{"flushq", 0x18, []Status{StatusOK}},
		{"quitq", 0x17, statuses},
		{"quit", 0x07, nil},
		{"noop", 0x0a, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := binCommands[tt.opcode]
			req := &Request{Binary: true, Opcode: tt.opcode, Op: c.op, Quiet: c.quiet, WithKey: c.withKey, Keys: [][]byte{[]byte("k")}, Key: []byte("k")}
			for _, s := range statuses {
				want := true
				for _, q := range tt.suppressed {
					if q == s {
						want = false
					}
				}
				got := len(AppendBinaryResponse(nil, req, &Response{Status: s})) > 0
				if got != want {
					t.Errorf("status %d: answered %v, want %v", s, got, want)
				}
			}
			if got := AppendBinaryError(nil, req, &RequestError{Status: StatusInvalid}); len(got) == 0 {
				t.Errorf("AppendBinaryError suppressed")
			}
		})
	}
}

// binServe plays the frontend's loop over a whole input stream with the codec under test:
// decode, answer (only noop, quit and errors are needed here), stop when memcached would
// close. It returns the bytes written and whether the connection was closed.
func binServe(in []byte, lim Limits) (out []byte, closed bool) {
	d := NewBinaryReader(bufio.NewReader(bytes.NewReader(in)), lim)
	var req Request
	for {
		err := d.Read(&req)
		var re *RequestError
		switch {
		case errors.As(err, &re):
			out = AppendBinaryError(out, &req, re)
			if re.Close {
				return out, true
			}
			continue
		case err == io.EOF:
			return out, false
		case err != nil:
			return out, true
		}
		if req.Op.IsSASL() { // as the frontend answers them without auth
			out = AppendBinaryError(out, &req, ErrSASLOff)
			continue
		}
		out = AppendBinaryResponse(out, &req, &Response{Status: StatusOK})
		if req.Op == OpQuit {
			return out, true
		}
	}
}

// binAnswer is one response packet, as the tests compare them.
type binAnswer struct {
	Opcode uint8
	Status uint16
	Opaque uint32
	Body   string
}

// binAnswers splits a response stream into packets.
func binAnswers(t *testing.T, b []byte) []binAnswer {
	t.Helper()
	var as []binAnswer
	for len(b) > 0 {
		if len(b) < 24 || b[0] != 0x81 {
			t.Fatalf("not a response packet: % x", b)
		}
		n := 24 + int(binary.BigEndian.Uint32(b[8:12]))
		if n > len(b) {
			t.Fatalf("short response packet: % x", b)
		}
		as = append(as, binAnswer{b[1], binary.BigEndian.Uint16(b[6:8]), binary.BigEndian.Uint32(b[12:16]), string(b[24:n])})
		b = b[n:]
	}
	return as
}

func TestBinaryReadPipelined(t *testing.T) {
	var reqs []Request
	for i := range 500 {
		k := []byte(fmt.Sprintf("key:%d", i))
		var r Request
		switch i % 6 {
		case 0:
			r = Request{Op: OpGet, Keys: [][]byte{k}, Quiet: true, WithKey: true}
		case 1:
			r = Request{Op: OpSet, Key: k, Value: bytes.Repeat([]byte{byte(i)}, i*13), Flags: uint32(i), Exptime: int64(i)}
		case 2:
			r = Request{Op: OpIncr, Key: k, Delta: uint64(i), Initial: 1, Create: true, Exptime: 5}
		case 3:
			r = Request{Op: OpDelete, Key: k, Cas: uint64(i)}
		case 4:
			r = Request{Op: OpGat, Keys: [][]byte{k}, Exptime: 7}
		case 5:
			r = Request{Op: OpNoop}
		}
		r.Binary, r.Opaque = true, uint32(i)
		r.Opcode, _ = BinaryOpcode(&r)
		reqs = append(reqs, r)
	}
	var stream []byte
	for i := range reqs {
		stream = AppendBinaryRequest(stream, &reqs[i])
	}
	readers := map[string]io.Reader{
		"whole":    bytes.NewReader(stream),
		"one byte": iotest.OneByteReader(bytes.NewReader(stream)),
		"half":     iotest.HalfReader(bytes.NewReader(stream)),
	}
	for name, r := range readers {
		t.Run(name, func(t *testing.T) {
			d := NewBinaryReader(bufio.NewReaderSize(r, 16), DefaultLimits())
			var got Request
			for i := range reqs {
				if err := d.Read(&got); err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if !binRequestsEqual(&got, &reqs[i]) {
					t.Fatalf("request %d:\n got %s\nwant %s", i, binFormatRequest(&got), binFormatRequest(&reqs[i]))
				}
			}
			if err := d.Read(&got); err != io.EOF {
				t.Fatalf("after the stream: %v, want io.EOF", err)
			}
		})
	}
}

func TestBinaryReadTruncated(t *testing.T) {
	full := binReq(0x01, 1, 0, binExt(0, 4, 0, 4), []byte("k"), []byte("value"))
	for n := 1; n < len(full); n++ {
		d := NewBinaryReader(bufio.NewReader(bytes.NewReader(full[:n])), DefaultLimits())
		var req Request
		if err := d.Read(&req); err != io.ErrUnexpectedEOF {
			t.Fatalf("%d of %d bytes: %v, want io.ErrUnexpectedEOF", n, len(full), err)
		}
	}
}

func TestBinaryReadBoundsMemory(t *testing.T) {
	lim := DefaultLimits()
	huge := binPacket{magic: 0x80, opcode: 0x01, ext: make([]byte, 8), key: []byte("k"), keyLen: -1, extLen: -1, bodyLen: 0xffffffff}.bytes()
	d := NewBinaryReader(bufio.NewReader(bytes.NewReader(huge)), lim)
	var req Request
	err := d.Read(&req)
	var re *RequestError
	if !errors.As(err, &re) || re.Status != StatusTooLarge || re.Close {
		t.Fatalf("Read = %v, want too large, connection kept", err)
	}
	// Only the extras and key of a rejected set are read (memcached unlinks the key).
	if cap(d.buf) > 255+lim.MaxKeyBytes || string(re.Unlink) != "k" {
		t.Fatalf("scratch grew to %d for a rejected body; unlink %q", cap(d.buf), re.Unlink)
	}

	big := binReq(0x01, 1, 0, binExt(0, 4, 0, 4), []byte("k"), make([]byte, 200<<10))
	stream := append(big, binReq(0x0a, 2, 0, nil, nil, nil)...)
	d = NewBinaryReader(bufio.NewReader(bytes.NewReader(stream)), lim)
	if err := d.Read(&req); err != nil || len(req.Value) != 200<<10 {
		t.Fatalf("big set: %v, %d bytes", err, len(req.Value))
	}
	if err := d.Read(&req); err != nil || req.Op != OpNoop {
		t.Fatalf("noop: %v %v", err, req.Op)
	}
	if cap(d.buf) > binMaxScratch {
		t.Fatalf("scratch of %d bytes kept after the big request", cap(d.buf))
	}
}

func TestBinaryReadAllocs(t *testing.T) {
	pkt := binReq(0x0c, 1, 0, nil, []byte("some:key"), nil)
	set := binReq(0x01, 1, 0, binExt(0, 4, 0, 4), []byte("some:key"), make([]byte, 100))
	r := bytes.NewReader(nil)
	br := bufio.NewReader(r)
	d := NewBinaryReader(br, DefaultLimits())
	var req Request
	stream := append(pkt, set...)
	allocs := testing.AllocsPerRun(100, func() {
		r.Reset(stream)
		br.Reset(r)
		d.Reset(br)
		if d.Read(&req) != nil || d.Read(&req) != nil {
			t.Fatal("Read failed")
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocs per get+set", allocs)
	}
}
