package protocol

import (
	"bufio"
	"bytes"
	"errors"
	"testing"
)

// binFuzzLimits keep the fuzzer's bodies small enough to explore.
var binFuzzLimits = Limits{MaxKeyBytes: 250, MaxValueBytes: 4096, MaxMultigetKeys: 100, MaxLineBytes: 2048}

// FuzzBinaryRead feeds arbitrary bytes to a BinaryReader: it never panics or hangs, its
// scratch never exceeds what the limits allow, and every request it accepts comes back
// unchanged from AppendBinaryRequest and a second Read.
func FuzzBinaryRead(f *testing.F) {
	f.Add(binReq(0x00, 1, 0, nil, []byte("key"), nil))
	f.Add(binReq(0x01, 1, 7, binExt(1, 4, 2, 4), []byte("key"), []byte("value")))
	f.Add(binReq(0x05, 1, 0, binExt(1, 8, 2, 8, 0xffffffff, 4), []byte("n"), nil))
	f.Add(append(binReq(0x40, 1, 0, nil, nil, []byte("xyz")), binReq(0x0a, 2, 0, nil, nil, nil)...))
	maxBody := 255 + binFuzzLimits.MaxKeyBytes + binFuzzLimits.MaxValueBytes
	f.Fuzz(func(t *testing.T, in []byte) {
		d := NewBinaryReader(bufio.NewReader(bytes.NewReader(in)), binFuzzLimits)
		var req Request
		for range 100 {
			err := d.Read(&req)
			if cap(d.buf) > maxBody {
				t.Fatalf("scratch of %d bytes", cap(d.buf))
			}
			var re *RequestError
			if errors.As(err, &re) {
				if re.Close {
					return
				}
				continue
			}
			if err != nil {
				return
			}
			enc := AppendBinaryRequest(nil, &req)
			d2 := NewBinaryReader(bufio.NewReader(bytes.NewReader(enc)), binFuzzLimits)
			var got Request
			if err := d2.Read(&got); err != nil {
				t.Fatalf("re-reading % x: %v", enc, err)
			}
			if !binRequestsEqual(&got, &req) {
				t.Fatalf("round trip:\n got %s\nwant %s", binFormatRequest(&got), binFormatRequest(&req))
			}
			if err := d2.Read(&got); err == nil {
				t.Fatalf("AppendBinaryRequest wrote more than one packet: % x", enc)
			}
		}
	})
}

// FuzzBinaryResponse feeds arbitrary bytes to ReadBinaryResponse: it never panics or hangs,
// never holds more than the limits allow, and a decoded get/getk hit or miss is written back
// by AppendBinaryResponse as the same packet.
func FuzzBinaryResponse(f *testing.F) {
	f.Add(binResp(0x00, 0, 1, 3, binU32(42), nil, []byte("hello")))
	f.Add(binResp(0x0c, 1, 1, 0, nil, []byte("key"), nil))
	f.Add(binResp(0x10, 0, 1, 0, nil, []byte("pid"), []byte("1")))
	f.Add(binResp(0x05, 0, 1, 0, nil, nil, binExt(1, 8)))
	maxBody := 255 + binFuzzLimits.MaxKeyBytes + binFuzzLimits.MaxValueBytes
	f.Fuzz(func(t *testing.T, in []byte) {
		br := bufio.NewReader(bytes.NewReader(in))
		var h BinaryResponseHeader
		var resp Response
		off := 0 // where the packet being read starts in
		for range 100 {
			start := off
			err := ReadBinaryResponse(br, binFuzzLimits, &h, &resp)
			off += 24 + int(h.BodyLen)
			if errors.Is(err, ErrBinaryTooLarge) {
				continue
			}
			if err != nil {
				return
			}
			if len(resp.Key)+len(resp.Value)+len(resp.Msg) > maxBody {
				t.Fatalf("response holds %d bytes", len(resp.Key)+len(resp.Value)+len(resp.Msg))
			}
			pkt := in[start : start+24+int(h.BodyLen)]
			c := binCommands[h.Opcode]
			hit := h.Status == BinStatusOK
			// Only canonical get-family packets: raw data type, flags exactly on hits, the
			// key exactly when the opcode returns it, a miss as memcached writes it.
			if c.op != OpGet || pkt[5] != 0 || (h.Status != BinStatusOK && h.Status != BinStatusNotFound) ||
				c.withKey != (h.KeyLen > 0) || (hit && h.ExtLen != 4) ||
				(!hit && (c.quiet || !c.withKey || h.ExtLen != 0 || h.Cas != 0 || h.BodyLen != uint32(h.KeyLen))) {
				continue
			}
			req := Request{Binary: true, Opcode: h.Opcode, Opaque: h.Opaque, Op: OpGet, WithKey: c.withKey, Quiet: c.quiet, Keys: [][]byte{resp.Key}}
			if got := AppendBinaryResponse(nil, &req, &resp); !bytes.Equal(got, pkt) {
				t.Fatalf("re-encoded\n got % x\nwant % x", got, pkt)
			}
		}
	})
}
