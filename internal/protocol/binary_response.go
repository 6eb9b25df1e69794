package protocol

import "encoding/binary"

// memcached's error texts, sent as the body of a binary error response.
const (
	binMsgNotFound       = "Not found"
	binMsgExists         = "Data exists for key."
	binMsgTooLarge       = "Too large."
	binMsgInvalid        = "Invalid arguments"
	binMsgNotStored      = "Not stored."
	binMsgNonNumeric     = "Non-numeric server-side value for incr or decr"
	binMsgNoMemory       = "Out of memory"
	binMsgUnknownCommand = "Unknown command"
	binMsgTempFailure    = "Temporary failure"
	binMsgAuthError      = "Auth failure."
)

// binStatusMsg is memcached's text for a binary status code.
func binStatusMsg(code uint16) string {
	switch code {
	case BinStatusNotFound:
		return binMsgNotFound
	case BinStatusExists:
		return binMsgExists
	case BinStatusTooLarge:
		return binMsgTooLarge
	case BinStatusInvalid:
		return binMsgInvalid
	case BinStatusNotStored:
		return binMsgNotStored
	case BinStatusNonNumeric:
		return binMsgNonNumeric
	case BinStatusNoMemory:
		return binMsgNoMemory
	case BinStatusUnknownCommand:
		return binMsgUnknownCommand
	case BinStatusTempFailure:
		return binMsgTempFailure
	case BinStatusAuthError:
		return binMsgAuthError
	}
	return ""
}

// binAppendHeader appends a 24-byte packet header. Data type and vbucket/status are
// raw bytes and zero except for a response's status.
func binAppendHeader(dst []byte, magic, opcode uint8, keyLen, extLen int, status uint16, bodyLen int, opaque uint32, cas uint64) []byte {
	dst = append(dst, magic, opcode)
	dst = binary.BigEndian.AppendUint16(dst, uint16(keyLen))
	dst = append(dst, uint8(extLen), 0)
	dst = binary.BigEndian.AppendUint16(dst, status)
	dst = binary.BigEndian.AppendUint32(dst, uint32(bodyLen))
	dst = binary.BigEndian.AppendUint32(dst, opaque)
	return binary.BigEndian.AppendUint64(dst, cas)
}

// binAppendStatus appends an answer carrying only a status and its text, as memcached
// writes errors: no extras, no key, cas 0.
func binAppendStatus(dst []byte, req *Request, code uint16, msg string) []byte {
	if msg == "" || code == BinStatusAuthError { // memcached -F answers a refused flush with its fixed text
		msg = binStatusMsg(code)
	}
	dst = binAppendHeader(dst, binMagicResponse, req.Opcode, 0, 0, code, len(msg), req.Opaque, 0)
	return append(dst, msg...)
}

// AppendBinaryError appends the answer to a request the decoder rejected: e's status with
// e.Msg (or memcached's text for the status) as body. Errors are never suppressed by a
// quiet opcode, as in memcached.
func AppendBinaryError(dst []byte, req *Request, e *RequestError) []byte {
	return binAppendStatus(dst, req, e.Status.BinaryStatus(), e.Msg)
}

// binResponseStatus is the binary status code for resp, as memcached answers req's command:
// a failed add is "exists", a failed replace "not found" (protocol_binary.h has no
// NOT_STORED for them); other commands keep the plain mapping.
func binResponseStatus(req *Request, s Status) uint16 {
	if s == StatusNotStored {
		switch req.Op {
		case OpAdd:
			return BinStatusExists
		case OpReplace:
			return BinStatusNotFound
		}
	}
	return s.BinaryStatus()
}

// binSuppressed reports whether a quiet request's answer is left out: a miss of getq,
// getkq, gatq, gatkq; the success of every other quiet command; anything for quitq.
func binSuppressed(req *Request, s Status) bool {
	if !req.Quiet {
		return false
	}
	switch {
	case req.Op == OpQuit:
		return true
	case req.Op.IsRetrieval():
		return s == StatusNotFound
	default:
		return s == StatusOK
	}
}

// binRequestKey is the key a single-key request names, as its client named it.
func binRequestKey(req *Request) []byte {
	if req.Op.IsRetrieval() {
		if len(req.Keys) > 0 {
			return req.ClientKey(req.Keys[0])
		}
		return nil
	}
	return req.ClientKey(req.Key)
}

// AppendBinaryResponse appends the answer packet(s) for req, as memcached 1.6 writes them:
// req's opcode and opaque echoed; on get/gat hits resp.Flags as extras, the key for
// getk/getkq/gatk/gatkq, the value and resp.Cas; on touch the flags only; on storage,
// delete, incr and decr success resp.Cas, with incr/decr's resp.Number as an 8-byte body;
// resp.Value as version string or SASL answer; one packet per resp.Stats entry then an empty terminator
// for stat. A status other than StatusOK is answered with resp.Msg (or memcached's text for
// the status) as body, except a getk/gatk miss, which carries the key instead. Nothing is
// appended when req.Quiet suppresses the answer.
func AppendBinaryResponse(dst []byte, req *Request, resp *Response) []byte {
	if binSuppressed(req, resp.Status) {
		return dst
	}
	if resp.Status != StatusOK {
		if req.WithKey && resp.Status == StatusNotFound {
			key := binRequestKey(req)
			dst = binAppendHeader(dst, binMagicResponse, req.Opcode, len(key), 0, BinStatusNotFound, len(key), req.Opaque, 0)
			return append(dst, key...)
		}
		return binAppendStatus(dst, req, binResponseStatus(req, resp.Status), resp.Msg)
	}
	switch req.Op {
	case OpGet, OpGets, OpGat, OpGats:
		var key []byte
		if req.WithKey {
			key = binRequestKey(req)
		}
		dst = binAppendHeader(dst, binMagicResponse, req.Opcode, len(key), 4, BinStatusOK, 4+len(key)+len(resp.Value), req.Opaque, resp.Cas)
		dst = binary.BigEndian.AppendUint32(dst, resp.Flags)
		dst = append(dst, key...)
		return append(dst, resp.Value...)
	case OpTouch:
		dst = binAppendHeader(dst, binMagicResponse, req.Opcode, 0, 4, BinStatusOK, 4, req.Opaque, resp.Cas)
		return binary.BigEndian.AppendUint32(dst, resp.Flags)
	case OpIncr, OpDecr:
		dst = binAppendHeader(dst, binMagicResponse, req.Opcode, 0, 0, BinStatusOK, 8, req.Opaque, resp.Cas)
		return binary.BigEndian.AppendUint64(dst, resp.Number)
	case OpVersion, OpSaslListMechs, OpSaslAuth, OpSaslStep:
		dst = binAppendHeader(dst, binMagicResponse, req.Opcode, 0, 0, BinStatusOK, len(resp.Value), req.Opaque, 0)
		return append(dst, resp.Value...)
	case OpStats:
		for _, st := range resp.Stats {
			dst = binAppendHeader(dst, binMagicResponse, req.Opcode, len(st.Name), 0, BinStatusOK, len(st.Name)+len(st.Value), req.Opaque, 0)
			dst = append(dst, st.Name...)
			dst = append(dst, st.Value...)
		}
		return binAppendHeader(dst, binMagicResponse, req.Opcode, 0, 0, BinStatusOK, 0, req.Opaque, 0)
	default: // storage, delete, noop, quit, flush, verbosity: the status is the answer
		return binAppendHeader(dst, binMagicResponse, req.Opcode, 0, 0, BinStatusOK, 0, req.Opaque, resp.Cas)
	}
}
