package protocol

import "strconv"

const textCRLF = "\r\n"

// AppendTextResponse appends to dst the text-protocol answer to req, given the server's
// resps: one per req.Keys for a retrieval, else one. It appends nothing when req.NoReply is
// set, and nothing for quit.
//
// A retrieval answers a VALUE block per hit, in resps order, then END. A retrieval key that
// failed with an error status (a backend that could not answer, say) turns the whole answer
// into that one error line, without END: a proxy must not pass a failure off as a miss.
func AppendTextResponse(dst []byte, req *Request, resps []Response) []byte {
	if req.NoReply || req.Op == OpQuit || req.Op == OpNoop {
		return dst
	}
	if req.Op.IsRetrieval() {
		return appendTextRetrieval(dst, req, resps)
	}
	if req.Op.IsMeta() {
		return appendMetaResponse(dst, req, resps)
	}
	if len(resps) == 0 {
		// The caller broke Server's contract; say so to the client rather than hang it.
		return appendTextLine(dst, "SERVER_ERROR ", textMsgNoAnswer)
	}
	resp := &resps[0]
	if resp.Status != StatusOK {
		return appendTextStatus(dst, resp)
	}
	switch req.Op {
	case OpSet, OpAdd, OpReplace, OpAppend, OpPrepend, OpCas:
		return append(dst, "STORED\r\n"...)
	case OpDelete:
		return append(dst, "DELETED\r\n"...)
	case OpIncr, OpDecr:
		dst = strconv.AppendUint(dst, resp.Number, 10)
		return append(dst, textCRLF...)
	case OpTouch:
		return append(dst, "TOUCHED\r\n"...)
	case OpCacheMemlimit:
		if resp.Value != nil { // a server's own answer, when not OK
			return appendTextLine(dst, string(resp.Value), "")
		}
		return append(dst, "OK\r\n"...)
	case OpVersion:
		dst = append(dst, "VERSION "...)
		dst = append(dst, resp.Value...)
		return append(dst, textCRLF...)
	case OpStats:
		if resp.Stats == nil && resp.Value != nil { // "stats reset", "stats detail on"
			dst = append(dst, resp.Value...)
			return append(dst, textCRLF...)
		}
		for _, s := range resp.Stats {
			dst = append(dst, "STAT "...)
			dst = append(dst, s.Name...)
			dst = append(dst, ' ')
			dst = append(dst, s.Value...)
			dst = append(dst, textCRLF...)
		}
		return append(dst, "END\r\n"...)
	default: // flush_all, verbosity
		return append(dst, "OK\r\n"...)
	}
}

func appendTextRetrieval(dst []byte, req *Request, resps []Response) []byte {
	dst, _ = AppendTextRetrievalPart(dst, req, resps, true)
	return dst
}

// AppendTextRetrievalPart appends one part of the answer to a retrieval whose answer is
// written as its keys' values arrive: a VALUE block per hit in resps, where resps[i]
// answers req.Keys[i], then END when last. A key that failed with an error status makes the
// part that one error line instead, which ends the answer: ended is true then, and after
// the last part.
func AppendTextRetrievalPart(dst []byte, req *Request, resps []Response, last bool) (out []byte, ended bool) {
	for i := range resps {
		if isTextError(resps[i].Status) {
			return appendTextStatus(dst, &resps[i]), true
		}
	}
	withCas := req.Op == OpGets || req.Op == OpGats
	for i := range resps {
		r := &resps[i]
		if r.Status != StatusOK {
			continue
		}
		key := r.Key
		if len(key) == 0 && i < len(req.Keys) {
			key = req.Keys[i]
		}
		dst = append(dst, "VALUE "...)
		dst = append(dst, req.ClientKey(key)...)
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, uint64(r.Flags), 10)
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, uint64(len(r.Value)), 10)
		if withCas {
			dst = append(dst, ' ')
			dst = strconv.AppendUint(dst, r.Cas, 10)
		}
		dst = append(dst, textCRLF...)
		dst = append(dst, r.Value...)
		dst = append(dst, textCRLF...)
	}
	if !last {
		return dst, false
	}
	return append(dst, "END\r\n"...), true
}

// isTextError reports whether s is an error rather than an outcome; for a retrieval the
// outcomes other than a hit all read as a miss.
func isTextError(s Status) bool {
	switch s {
	case StatusOK, StatusNotFound, StatusExists, StatusNotStored:
		return false
	}
	return true
}

// appendTextStatus appends the answer line for any status but StatusOK, whose line depends on
// the command.
func appendTextStatus(dst []byte, r *Response) []byte {
	switch r.Status {
	case StatusNotFound:
		return append(dst, "NOT_FOUND\r\n"...)
	case StatusExists:
		return append(dst, "EXISTS\r\n"...)
	case StatusNotStored:
		return append(dst, "NOT_STORED\r\n"...)
	case StatusNonNumeric:
		return appendTextLine(dst, "CLIENT_ERROR ", textMsgNonNumeric)
	case StatusTooLarge:
		return appendTextLine(dst, "SERVER_ERROR ", textMsgTooLarge)
	case StatusNoMemory:
		return appendTextLine(dst, "SERVER_ERROR ", textMsgNoMemory)
	case StatusInvalid, StatusAuthError:
		return appendTextLine(dst, "CLIENT_ERROR ", r.Msg)
	case StatusUnknownCommand:
		return append(dst, "ERROR\r\n"...)
	default:
		return appendTextLine(dst, "SERVER_ERROR ", r.Msg)
	}
}

func appendTextLine(dst []byte, prefix, msg string) []byte {
	dst = append(dst, prefix...)
	dst = append(dst, msg...)
	return append(dst, textCRLF...)
}

// AppendTextError appends memcached's answer to a rejected request: "ERROR",
// "CLIENT_ERROR <msg>" or "SERVER_ERROR <msg>", with "\r\n".
func AppendTextError(dst []byte, e *RequestError) []byte {
	if e.Line != "" {
		return appendTextLine(dst, e.Line, "")
	}
	switch e.Status {
	case StatusUnknownCommand:
		return append(dst, "ERROR\r\n"...)
	case StatusTooLarge, StatusNoMemory, StatusTempFailure:
		return appendTextLine(dst, "SERVER_ERROR ", e.Msg)
	default:
		return appendTextLine(dst, "CLIENT_ERROR ", e.Msg)
	}
}

// AppendTextRequest appends req as a client sends it, data block included. Decoding the
// result with a TextReader gives back an equal request. Binary-only fields are ignored.
func AppendTextRequest(dst []byte, req *Request) []byte {
	if req.Op.IsMeta() {
		return appendMetaRequest(dst, req, true)
	}
	dst = append(dst, req.Op.String()...)
	switch req.Op {
	case OpGet, OpGets, OpGat, OpGats:
		if req.Op == OpGat || req.Op == OpGats {
			dst = append(dst, ' ')
			dst = strconv.AppendInt(dst, req.Exptime, 10)
		}
		for _, k := range req.Keys {
			dst = append(dst, ' ')
			dst = append(dst, k...)
		}
		return append(dst, textCRLF...)
	case OpSet, OpAdd, OpReplace, OpAppend, OpPrepend, OpCas:
		dst = append(dst, ' ')
		dst = append(dst, req.Key...)
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, uint64(req.Flags), 10)
		dst = append(dst, ' ')
		dst = strconv.AppendInt(dst, req.Exptime, 10)
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, uint64(len(req.Value)), 10)
		if req.Op == OpCas {
			dst = append(dst, ' ')
			dst = strconv.AppendUint(dst, req.Cas, 10)
		}
		dst = appendTextNoReply(dst, req)
		dst = append(dst, req.Value...)
		return append(dst, textCRLF...)
	case OpDelete:
		dst = append(dst, ' ')
		dst = append(dst, req.Key...)
	case OpIncr, OpDecr:
		dst = append(dst, ' ')
		dst = append(dst, req.Key...)
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, req.Delta, 10)
	case OpCacheMemlimit:
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, req.Delta, 10)
	case OpTouch:
		dst = append(dst, ' ')
		dst = append(dst, req.Key...)
		dst = append(dst, ' ')
		dst = strconv.AppendInt(dst, req.Exptime, 10)
	case OpFlushAll:
		if req.Exptime != 0 {
			dst = append(dst, ' ')
			dst = strconv.AppendInt(dst, req.Exptime, 10)
		}
	case OpVerbosity:
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, uint64(req.Level), 10)
	case OpStats:
		if len(req.Args) > 0 {
			dst = append(dst, ' ')
			dst = append(dst, req.Args...)
		}
		return append(dst, textCRLF...)
	default: // version, quit
		return append(dst, textCRLF...)
	}
	return appendTextNoReply(dst, req)
}

// appendTextNoReply ends a command line, with " noreply" when req has it.
func appendTextNoReply(dst []byte, req *Request) []byte {
	if req.NoReply {
		dst = append(dst, " noreply"...)
	}
	return append(dst, textCRLF...)
}
