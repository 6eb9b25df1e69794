package protocol

import (
	"bufio"
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func TestBinaryReadResponse(t *testing.T) {
	k := []byte("key")
	tests := []struct {
		name  string
		in    []byte
		wantH BinaryResponseHeader
		want  Response
	}{
		{"get hit", binResp(0x00, 0, 7, 3, binU32(42), nil, []byte("hello")),
			BinaryResponseHeader{Opcode: 0x00, Opaque: 7, Cas: 3, ExtLen: 4, BodyLen: 9}, Response{Value: []byte("hello"), Flags: 42, Cas: 3}},
		{"getk hit", binResp(0x0c, 0, 7, 3, binU32(42), k, []byte("hello")),
			BinaryResponseHeader{Opcode: 0x0c, Opaque: 7, Cas: 3, ExtLen: 4, KeyLen: 3, BodyLen: 12}, Response{Key: k, Value: []byte("hello"), Flags: 42, Cas: 3}},
		{"get miss", binResp(0x00, 1, 7, 0, nil, nil, []byte("Not found")),
			BinaryResponseHeader{Opcode: 0x00, Status: 1, Opaque: 7, BodyLen: 9}, Response{Status: StatusNotFound, Msg: "Not found"}},
		{"getk miss", binResp(0x0c, 1, 7, 0, nil, k, nil),
			BinaryResponseHeader{Opcode: 0x0c, Status: 1, Opaque: 7, KeyLen: 3, BodyLen: 3}, Response{Status: StatusNotFound, Key: k}},
		{"touch", binResp(0x1c, 0, 7, 3, binU32(9), nil, nil),
			BinaryResponseHeader{Opcode: 0x1c, Opaque: 7, Cas: 3, ExtLen: 4, BodyLen: 4}, Response{Flags: 9, Cas: 3}},
		{"incr", binResp(0x05, 0, 7, 3, nil, nil, binExt(15, 8)),
			BinaryResponseHeader{Opcode: 0x05, Opaque: 7, Cas: 3, BodyLen: 8}, Response{Number: 15, Cas: 3}},
		{"version", binResp(0x0b, 0, 7, 0, nil, nil, []byte("1.6.18")),
			BinaryResponseHeader{Opcode: 0x0b, Opaque: 7, BodyLen: 6}, Response{Value: []byte("1.6.18")}},
		{"stat line", binResp(0x10, 0, 7, 0, nil, []byte("pid"), []byte("12")),
			BinaryResponseHeader{Opcode: 0x10, Opaque: 7, KeyLen: 3, BodyLen: 5}, Response{Stats: []Stat{{"pid", "12"}}}},
		{"stat end", binResp(0x10, 0, 7, 0, nil, nil, nil),
			BinaryResponseHeader{Opcode: 0x10, Opaque: 7}, Response{}},
		{"add exists is not stored", binResp(0x02, 2, 7, 0, nil, nil, []byte("Data exists for key.")),
			BinaryResponseHeader{Opcode: 0x02, Status: 2, Opaque: 7, BodyLen: 20}, Response{Status: StatusNotStored, Msg: "Data exists for key."}},
		{"replaceq not found is not stored", binResp(0x13, 1, 7, 0, nil, nil, []byte("Not found")),
			BinaryResponseHeader{Opcode: 0x13, Status: 1, Opaque: 7, BodyLen: 9}, Response{Status: StatusNotStored, Msg: "Not found"}},
		{"set exists", binResp(0x01, 2, 7, 0, nil, nil, []byte("Data exists for key.")),
			BinaryResponseHeader{Opcode: 0x01, Status: 2, Opaque: 7, BodyLen: 20}, Response{Status: StatusExists, Msg: "Data exists for key."}},
		{"server error text", binResp(0x01, 0x82, 7, 0, nil, nil, []byte("Out of memory allocating")),
			BinaryResponseHeader{Opcode: 0x01, Status: 0x82, Opaque: 7, BodyLen: 24}, Response{Status: StatusNoMemory, Msg: "Out of memory allocating"}},
		{"busy is temporary failure", binResp(0x00, 0x85, 7, 0, nil, nil, nil),
			BinaryResponseHeader{Opcode: 0x00, Status: 0x85, Opaque: 7}, Response{Status: StatusTempFailure}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			br := bufio.NewReader(bytes.NewReader(tt.in))
			var h BinaryResponseHeader
			resp := Response{Key: []byte("stale"), Msg: "stale"}
			if err := ReadBinaryResponse(br, DefaultLimits(), &h, &resp); err != nil {
				t.Fatal(err)
			}
			if h != tt.wantH {
				t.Errorf("header %+v, want %+v", h, tt.wantH)
			}
			if !reflect.DeepEqual(resp, tt.want) {
				t.Errorf("response %+v, want %+v", resp, tt.want)
			}
			// The Response owns its bytes: scribbling over the input changes nothing.
			for i := range tt.in {
				tt.in[i] = 0xee
			}
			if !reflect.DeepEqual(resp, tt.want) {
				t.Errorf("response shares the reader's bytes: %+v", resp)
			}
		})
	}
}

func TestBinaryReadResponseErrors(t *testing.T) {
	lim := Limits{MaxKeyBytes: 250, MaxValueBytes: 100}
	next := binResp(0x0a, 0, 9, 0, nil, nil, nil)
	tests := []struct {
		name     string
		in       []byte
		want     error // nil: any error
		thenNoop bool  // the stream is still in step afterwards
	}{
		{"body over limits", binResp(0x00, 0, 7, 0, binU32(0), nil, make([]byte, 700)), ErrBinaryTooLarge, true},
		{"request magic", binReq(0x00, 7, 0, nil, []byte("k"), nil), ErrBinaryMagic, false},
		{"key and extras past body", binPacket{magic: 0x81, keyLen: 5, extLen: 4, bodyLen: 3}.bytes(), nil, false},
		{"incr body not 8 bytes", binResp(0x05, 0, 7, 0, nil, nil, []byte("12")), nil, true},
		{"truncated", binResp(0x00, 0, 7, 0, binU32(0), nil, []byte("hello"))[:30], nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.in
			if tt.thenNoop {
				in = append(append([]byte(nil), in...), next...)
			}
			br := bufio.NewReader(bytes.NewReader(in))
			var h BinaryResponseHeader
			var resp Response
			err := ReadBinaryResponse(br, lim, &h, &resp)
			if err == nil || (tt.want != nil && !errors.Is(err, tt.want)) {
				t.Fatalf("err %v, want %v", err, tt.want)
			}
			if tt.thenNoop {
				if err := ReadBinaryResponse(br, lim, &h, &resp); err != nil || h.Opcode != 0x0a || h.Opaque != 9 {
					t.Fatalf("next packet: %v %+v", err, h)
				}
			}
		})
	}
}

// AppendBinaryRead is AppendBinaryRequest of a one-key retrieval, without the Request.
func TestAppendBinaryReadIsOneKeyRequest(t *testing.T) {
	for _, op := range []Op{OpGet, OpGets, OpGat, OpGats} {
		for _, quiet := range []bool{false, true} {
			req := Request{Op: op, Keys: [][]byte{[]byte("key")}, Exptime: 300, Opaque: 7, Quiet: quiet}
			want := AppendBinaryRequest(nil, &req)
			if got := AppendBinaryRead(nil, op, 300, []byte("key"), 7, quiet); !bytes.Equal(got, want) {
				t.Errorf("%v quiet=%v: % x, want % x", op, quiet, got, want)
			}
		}
	}
}
