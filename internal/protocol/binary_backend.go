package protocol

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// BinaryOpcode is the request opcode that carries req to a memcached server: derived from
// req.Op, req.Quiet and req.WithKey (never from req.Opcode, which a text request leaves 0,
// the opcode of get). gets and gats map to get and gat, whose answers always carry the cas;
// cas maps to set, whose header carries it. Commands without a quiet opcode (touch, stat,
// version, noop, verbosity) ignore Quiet. ok is false for OpInvalid.
func BinaryOpcode(req *Request) (opcode uint8, ok bool) {
	q := req.Quiet
	pick := func(loud, quiet uint8) uint8 {
		if q {
			return quiet
		}
		return loud
	}
	switch req.Op {
	case OpGet, OpGets:
		if req.WithKey {
			return pick(binOpGetK, binOpGetKQ), true
		}
		return pick(binOpGet, binOpGetQ), true
	case OpGat, OpGats:
		if req.WithKey {
			return pick(binOpGatK, binOpGatKQ), true
		}
		return pick(binOpGat, binOpGatQ), true
	case OpSet, OpCas:
		return pick(binOpSet, binOpSetQ), true
	case OpAdd:
		return pick(binOpAdd, binOpAddQ), true
	case OpReplace:
		return pick(binOpReplace, binOpReplaceQ), true
	case OpAppend:
		return pick(binOpAppend, binOpAppendQ), true
	case OpPrepend:
		return pick(binOpPrepend, binOpPrependQ), true
	case OpDelete:
		return pick(binOpDelete, binOpDeleteQ), true
	case OpIncr:
		return pick(binOpIncr, binOpIncrQ), true
	case OpDecr:
		return pick(binOpDecr, binOpDecrQ), true
	case OpQuit:
		return pick(binOpQuit, binOpQuitQ), true
	case OpFlushAll:
		return pick(binOpFlush, binOpFlushQ), true
	case OpTouch:
		return binOpTouch, true
	case OpVersion:
		return binOpVersion, true
	case OpStats:
		return binOpStat, true
	case OpVerbosity:
		return binOpVerbosity, true
	case OpNoop:
		return binOpNoop, true
	case OpSaslListMechs:
		return binOpSaslList, true
	case OpSaslAuth:
		return binOpSaslAuth, true
	case OpSaslStep:
		return binOpSaslStep, true
	}
	return 0, false
}

// binExpiredAt is an absolute expiry in 1970: memcached takes a binary exptime over 30
// days as a Unix time and one before its start as already expired. The 32-bit unsigned
// field has no negative values, which text uses for "expire at once".
const binExpiredAt = 30*24*3600 + 1

// binExptime is exp as a binary expiry field.
func binExptime(exp int64) uint32 {
	switch {
	case exp < 0:
		return binExpiredAt
	case exp > math.MaxUint32:
		return math.MaxUint32
	}
	return uint32(exp)
}

// AppendBinaryRead appends a binary get of key (a gat when op is one), quiet or not, with
// opaque: what a backend sends for each key of a retrieval, without a Request per key.
func AppendBinaryRead(dst []byte, op Op, exptime int64, key []byte, opaque uint32, quiet bool) []byte {
	touches := op == OpGat || op == OpGats
	opcode := uint8(binOpGet)
	switch {
	case touches && quiet:
		opcode = binOpGatQ
	case touches:
		opcode = binOpGat
	case quiet:
		opcode = binOpGetQ
	}
	return appendBinaryRead(dst, opcode, op, exptime, key, opaque)
}

func appendBinaryRead(dst []byte, opcode uint8, op Op, exptime int64, key []byte, opaque uint32) []byte {
	if op == OpGat || op == OpGats {
		dst = binAppendHeader(dst, binMagicRequest, opcode, len(key), 4, 0, 4+len(key), opaque, 0)
		dst = binary.BigEndian.AppendUint32(dst, binExptime(exptime))
	} else {
		dst = binAppendHeader(dst, binMagicRequest, opcode, len(key), 0, 0, len(key), opaque, 0)
	}
	return append(dst, key...)
}

// AppendBinaryRequest appends req as request packet(s) with opcode BinaryOpcode(req),
// opaque req.Opaque and cas req.Cas: a retrieval gives one packet per req.Keys entry, all
// with that opaque; any other command one packet. An OpInvalid request appends nothing.
// A request decoded by BinaryReader.Read is encoded so that Read gives it back unchanged.
func AppendBinaryRequest(dst []byte, req *Request) []byte {
	opcode, ok := BinaryOpcode(req)
	if !ok {
		return dst
	}
	hdr := func(keyLen, extLen, valueLen int, cas uint64) {
		dst = binAppendHeader(dst, binMagicRequest, opcode, keyLen, extLen, 0, extLen+keyLen+valueLen, req.Opaque, cas)
	}
	switch req.Op {
	case OpGet, OpGets, OpGat, OpGats:
		for _, k := range req.Keys {
			dst = appendBinaryRead(dst, opcode, req.Op, req.Exptime, k, req.Opaque)
		}
	case OpSet, OpCas, OpAdd, OpReplace:
		hdr(len(req.Key), 8, len(req.Value), req.Cas)
		dst = binary.BigEndian.AppendUint32(dst, req.Flags)
		dst = binary.BigEndian.AppendUint32(dst, binExptime(req.Exptime))
		dst = append(dst, req.Key...)
		dst = append(dst, req.Value...)
	case OpAppend, OpPrepend:
		hdr(len(req.Key), 0, len(req.Value), req.Cas)
		dst = append(dst, req.Key...)
		dst = append(dst, req.Value...)
	case OpDelete:
		hdr(len(req.Key), 0, 0, req.Cas)
		dst = append(dst, req.Key...)
	case OpIncr, OpDecr:
		exp := uint32(binNoCreate)
		if req.Create {
			exp = min(binExptime(req.Exptime), binNoCreate-1)
		}
		hdr(len(req.Key), 20, 0, req.Cas)
		dst = binary.BigEndian.AppendUint64(dst, req.Delta)
		dst = binary.BigEndian.AppendUint64(dst, req.Initial)
		dst = binary.BigEndian.AppendUint32(dst, exp)
		dst = append(dst, req.Key...)
	case OpTouch:
		hdr(len(req.Key), 4, 0, 0)
		dst = binary.BigEndian.AppendUint32(dst, binExptime(req.Exptime))
		dst = append(dst, req.Key...)
	case OpFlushAll:
		if req.Exptime == 0 {
			hdr(0, 0, 0, 0)
		} else {
			hdr(0, 4, 0, 0)
			dst = binary.BigEndian.AppendUint32(dst, binExptime(req.Exptime))
		}
	case OpVerbosity:
		hdr(0, 4, 0, 0)
		dst = binary.BigEndian.AppendUint32(dst, req.Level)
	case OpStats:
		hdr(len(req.Args), 0, 0, 0)
		dst = append(dst, req.Args...)
	case OpSaslAuth, OpSaslStep:
		hdr(len(req.Key), 0, len(req.Value), 0)
		dst = append(dst, req.Key...)
		dst = append(dst, req.Value...)
	default: // noop, version, quit, sasl list mechs
		hdr(0, 0, 0, 0)
	}
	return dst
}

// BinaryResponseHeader is the fixed part of a response packet from a server.
type BinaryResponseHeader struct {
	Opcode  uint8
	Status  uint16 // the binary status code; the Response carries StatusFromBinary of it
	Opaque  uint32
	Cas     uint64
	KeyLen  uint16
	ExtLen  uint8
	BodyLen uint32
}

// StatEnd reports whether h ends a stat answer: the empty packet after the last stat, or
// an error status, after which the server sends nothing more for that request.
func (h *BinaryResponseHeader) StatEnd() bool {
	return h.Status != BinStatusOK || h.KeyLen == 0
}

// ErrBinaryTooLarge is returned by ReadBinaryResponse for a packet whose body exceeds the
// limits. The body has been discarded, so the stream is still in step and the connection
// can be kept; only that answer is lost.
var ErrBinaryTooLarge = errors.New("protocol: binary response exceeds limits")

// ReadBinaryResponse reads one response packet from r into h and resp.
//
// resp is overwritten, except resp.Stats: a stat packet carrying a name appends one Stat to
// it, so that a caller reading a whole stat answer into one Response until h.StatEnd()
// gets every line in order. Otherwise resp gets Status (StatusFromBinary, with a failed
// add reported as StatusNotStored as text memcached does; likewise a failed replace),
// Cas, Flags (get family and touch extras), Key (getk family), Value (hits; version string),
// Number (incr/decr) and Msg (error body, on one line: see binReadMsg).
//
// resp.Key and resp.Value are allocated for this response and owned by it: nothing in r's
// buffers is referenced after the call. A body longer than 255 + lim.MaxKeyBytes +
// lim.MaxValueBytes is never allocated: it is discarded and ErrBinaryTooLarge returned. A
// wrong magic byte gives ErrBinaryMagic; any other error leaves the stream unusable.
func ReadBinaryResponse(r *bufio.Reader, lim Limits, h *BinaryResponseHeader, resp *Response) error {
	hb, err := readSmall(r, binHeaderLen)
	if err != nil {
		return err
	}
	if hb[0] != binMagicResponse {
		return ErrBinaryMagic
	}
	*h = BinaryResponseHeader{
		Opcode:  hb[1],
		KeyLen:  binary.BigEndian.Uint16(hb[2:4]),
		ExtLen:  hb[4],
		Status:  binary.BigEndian.Uint16(hb[6:8]),
		BodyLen: binary.BigEndian.Uint32(hb[8:12]),
		Opaque:  binary.BigEndian.Uint32(hb[12:16]),
		Cas:     binary.BigEndian.Uint64(hb[16:24]),
	}
	stats := resp.Stats
	*resp = Response{Stats: stats, Status: binResponseFromStatus(h.Opcode, h.Status), Cas: h.Cas}

	extLen, keyLen, bodyLen := int64(h.ExtLen), int64(h.KeyLen), int64(h.BodyLen)
	if extLen+keyLen > bodyLen {
		return fmt.Errorf("protocol: binary response: extras %d + key %d > body %d", extLen, keyLen, bodyLen)
	}
	if bodyLen > 255+int64(lim.MaxKeyBytes)+int64(lim.MaxValueBytes) {
		if _, err := r.Discard(int(bodyLen)); err != nil {
			return binNoEOF(err)
		}
		return ErrBinaryTooLarge
	}
	ext, err := readSmall(r, int(extLen))
	if err != nil {
		return binNoEOF(err)
	}
	var flags uint32
	if extLen == 4 {
		flags = binary.BigEndian.Uint32(ext) // read now: ext is r's buffer, which the value's read reuses
	}
	rest := int(bodyLen - extLen)
	if h.Status != BinStatusOK && keyLen == 0 {
		return binReadMsg(r, rest, h.Status, resp)
	}
	var data []byte
	if rest > 0 {
		data = make([]byte, rest)
		if _, err := io.ReadFull(r, data); err != nil {
			return binNoEOF(err)
		}
	}
	key, value := data[:keyLen:keyLen], data[keyLen:]
	if keyLen == 0 {
		key = nil
	}
	if len(value) == 0 {
		value = nil
	}

	switch h.Opcode {
	case binOpStat:
		if key != nil {
			resp.Stats = append(resp.Stats, Stat{Name: string(key), Value: string(value)})
		}
		return nil
	case binOpIncr, binOpIncrQ, binOpDecr, binOpDecrQ:
		if h.Status == BinStatusOK {
			if len(value) != 8 {
				return fmt.Errorf("protocol: binary incr/decr response of %d bytes", len(value))
			}
			resp.Number = binary.BigEndian.Uint64(value)
			return nil
		}
	}
	resp.Flags = flags
	resp.Key = key
	resp.Value = value
	return nil
}

// readSmall reads the next n bytes, as io.ReadFull does, where they fit r's buffer without
// copying them: the result is r's own, valid until r is read again. (A header read into an
// array through io.Reader would put the array on the heap, an allocation per answer.)
func readSmall(r *bufio.Reader, n int) ([]byte, error) {
	if n > r.Size() {
		b := make([]byte, n)
		_, err := io.ReadFull(r, b)
		return b, err
	}
	b, err := r.Peek(n)
	if err != nil {
		if len(b) > 0 && errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	_, err = r.Discard(n)
	return b, err
}

// binResponseFromStatus is the Status for a server's answer to opcode: memcached answers
// a failed add "exists" and a failed replace "not found", which text calls NOT_STORED.
func binResponseFromStatus(opcode uint8, code uint16) Status {
	switch {
	case code == BinStatusExists && (opcode == binOpAdd || opcode == binOpAddQ):
		return StatusNotStored
	case code == BinStatusNotFound && (opcode == binOpReplace || opcode == binOpReplaceQ):
		return StatusNotStored
	}
	return StatusFromBinary(code)
}

// maxServerMsg bounds a server's error text kept for a client: memcached's are a few words.
const maxServerMsg = 256

// binReadMsg reads an error body of n bytes into resp.Msg, on one line and at most
// maxServerMsg bytes of it (see OneLine), sharing memcached's usual texts rather than
// allocating them again for every miss.
func binReadMsg(r *bufio.Reader, n int, code uint16, resp *Response) error {
	b, err := r.Peek(min(n, maxServerMsg, r.Size()))
	if err != nil {
		return binNoEOF(err)
	}
	if msg := binStatusMsg(code); len(b) == n && string(b) == msg {
		resp.Msg = msg
	} else {
		resp.Msg = string(OneLine(bytes.Clone(b)))
	}
	_, err = r.Discard(n)
	return binNoEOF(err)
}

// OneLine replaces CR, LF and NUL in b with spaces, in place, and returns b. A server's text
// given to a client (an error message) goes through it: a line break in it would end the
// client's answer early and make the rest, a forged VALUE block say, the answer to the
// client's next request; a NUL cuts a C client's string short.
func OneLine(b []byte) []byte {
	for i, c := range b {
		if c == '\r' || c == '\n' || c == 0 {
			b[i] = ' '
		}
	}
	return b
}
