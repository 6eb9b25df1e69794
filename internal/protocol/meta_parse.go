package protocol

import "bytes"

// metaMaxTokens is memcached's bound on a meta line: with the command and the key, 19
// tokens; more is "options flags too long".
const metaMaxTokens = 19

// The meta CLIENT_ERROR messages, worded as memcached 1.6.18 words them.
const (
	metaMsgDuplicate    = "duplicate flag"
	metaMsgInvalidFlag  = "invalid flag"
	metaMsgBadToken     = "bad token in command line format"
	metaMsgDecodeKey    = "error decoding key"
	metaMsgModeLength   = "incorrect length for M token"
	metaMsgInitial      = "invalid numeric initial value"
	metaMsgDelta        = "invalid numeric delta value"
	metaMsgInvalidOrDup = "invalid or duplicate flag"
	metaMsgTooManyGet   = "options flags are too long" // mg's wording
	metaMsgTooMany      = "options flags too long"     // ms md ma
	metaMsgSetMode      = "invalid mode for ms M token"
	metaMsgArithMode    = "invalid mode for ma M token"
)

// metaScratch is a TextReader's memory for meta lines, kept between requests.
type metaScratch struct {
	line []byte // an ms line, copied: reading its data block may move the reader's buffer
	key  []byte // the decoded key of a b request
}

// parseMeta decodes a meta command line (and the data block of ms) into req, answering what
// memcached 1.6.18 answers to a malformed one, in the order it checks.
func (d *TextReader) parseMeta(op Op, line []byte, req *Request) error {
	req.Op = op
	if op == OpMetaNoop {
		return nil // memcached answers MN whatever follows
	}
	// memcached reads the line as a C string: a NUL ends it.
	if i := bytes.IndexByte(line, 0); i >= 0 {
		line = line[:i]
	}
	if op == OpMetaSet {
		d.meta.line = append(d.meta.line[:0], line...)
		line = d.meta.line
	}
	var toks [metaMaxTokens + 1][]byte
	n := splitTokens(line, toks[:])
	if n < 2 {
		return textErrUnknown()
	}
	if len(toks[1]) > d.lim.MaxKeyBytes {
		return textErrBadFormat()
	}
	first := 2
	if op == OpMetaSet {
		if n == 2 {
			return textErrBadFormat()
		}
		first = 3
	}
	if n > metaMaxTokens {
		if op == OpMetaGet {
			return textErrClient(metaMsgTooManyGet)
		}
		return textErrClient(metaMsgTooMany)
	}
	m := &req.Meta
	m.KeyToken = toks[1]
	req.Key = toks[1]
	if op == OpMetaArithmetic {
		m.Delta = 1
	}
	var size int64
	if op == OpMetaSet {
		v, ok := metaParseInt32(toks[2])
		if !ok || v < 0 || v > 1<<31-1-2 {
			return textErrBadFormat()
		}
		size = v
	}
	msg, ok := d.parseMetaFlags(toks[first:n], req)
	switch {
	case !ok && (op == OpMetaDelete || op == OpMetaArithmetic):
		return textErrClient(metaMsgInvalidOrDup)
	case !ok && op == OpMetaSet:
		return d.metaSwallow(size, textErrClient(msg))
	case !ok:
		return textErrClient(msg)
	}
	switch op {
	case OpMetaSet:
		return d.finishMetaSet(req, size)
	case OpMetaDelete:
		if metaOpaqueTooLong(m) {
			return textErrClient(MetaMsgOpaqueTooLong)
		}
	case OpMetaArithmetic:
		switch m.Mode {
		case 0, 'I', '+', 'D', '-':
		default:
			return textErrClient(metaMsgArithMode)
		}
	}
	// mg and ma check the opaque's length while answering, after they took effect: the
	// store (or the server) answers that error.
	return nil
}

// finishMetaSet checks an ms request's mode, opaque and size, as memcached does before it
// reads the data block (swallowing the block on an error), then reads the block.
func (d *TextReader) finishMetaSet(req *Request, size int64) error {
	m := &req.Meta
	switch m.Mode {
	case 0, 'E', 'A', 'P', 'R', 'S':
	default:
		return d.metaSwallow(size, textErrClient(metaMsgSetMode))
	}
	if metaOpaqueTooLong(m) {
		return d.metaSwallow(size, textErrClient(MetaMsgOpaqueTooLong))
	}
	if size > int64(d.lim.MaxValueBytes) {
		// memcached also unlinks the key, so that no value older than the failed write
		// stays readable.
		e := &RequestError{Status: StatusTooLarge, Msg: textMsgTooLarge}
		d.key = append(d.key[:0], req.Key...)
		e.Unlink = d.key
		return d.metaSwallow(size, e)
	}
	return d.readValue(req, int(size))
}

// metaSwallow answers e and drops the data block of a rejected ms, as memcached does.
func (d *TextReader) metaSwallow(size int64, e *RequestError) error {
	d.discard = size + 2
	return e
}

func metaOpaqueTooLong(m *MetaRequest) bool {
	f, ok := m.Flag('O')
	return ok && 1+len(f.Token) > MetaMaxOpaque
}

// parseMetaFlags reads the flag tokens into req.Meta as memcached's _meta_flag_preparse
// does: a duplicate or unknown flag stops at once, other bad tokens are noted (the last
// message noted wins) and the rest is still read. On failure msg is the CLIENT_ERROR text.
func (d *TextReader) parseMetaFlags(toks [][]byte, req *Request) (msg string, ok bool) {
	m := &req.Meta
	var seen [128]bool
	msg, ok = textMsgBadFormat, true
	bad := func(s string) { msg, ok = s, false }
	for _, t := range toks {
		c := t[0]
		if c >= 127 || seen[c] {
			return metaMsgDuplicate, false
		}
		seen[c] = true
		arg := t[1:]
		switch c {
		case 'b':
			m.Base64 = true
			key, good := MetaDecodeKey(d.meta.key[:0], m.KeyToken)
			d.meta.key = key
			if !good {
				bad(metaMsgDecodeKey)
			}
			req.Key = key
		case 'N', 'T', 'R':
			v, good := metaParseInt32(arg)
			if !good {
				bad(metaMsgBadToken)
				break
			}
			switch c {
			case 'N':
				m.Vivify, m.VivifyTTL = true, v
			case 'T':
				m.HasTTL, m.TTL = true, v
			default:
				m.Recache, m.RecacheTTL = true, v
			}
		case 'F':
			v, good := textParseUint32(metaNumber(arg))
			if !good {
				ok = false // memcached notes the error without a message of its own
			}
			m.ClientFlags = v
		case 'C':
			v, good := textParseUint64(metaNumber(arg))
			if !good {
				bad(metaMsgBadToken)
			}
			m.HasCas, m.Cas = good, v
		case 'M':
			if len(t) != 2 {
				bad(metaMsgModeLength)
				break
			}
			m.Mode = t[1]
		case 'J':
			v, good := textParseUint64(metaNumber(arg))
			if !good {
				bad(metaMsgInitial)
			}
			m.Initial = v
		case 'D':
			v, good := textParseUint64(metaNumber(arg))
			if !good {
				bad(metaMsgDelta)
			}
			m.Delta = v
		case 'q':
			m.Quiet = true
		case 'v':
			m.ReturnValue = true
		case 'u':
			m.NoBump = true
		case 'I':
			m.Invalidate = true
		case 'l', 'O', 'P', 'L', 'k', 's', 't', 'c', 'f', 'h':
		default:
			return metaMsgInvalidFlag, false
		}
		m.Flags = append(m.Flags, MetaFlag{Letter: c, Token: arg})
	}
	return msg, ok
}

// metaNumber is the part of a token that C's strtol family reads: leading white space
// skipped, and the number ending at white space (which memcached's safe_strto* accept).
func metaNumber(b []byte) []byte {
	for len(b) > 0 && isCSpace(b[0]) {
		b = b[1:]
	}
	for i, c := range b {
		if isCSpace(c) {
			return b[:i]
		}
	}
	return b
}

// metaParseInt32 is memcached's safe_strtol on a meta token.
func metaParseInt32(b []byte) (int64, bool) {
	return textParseInt32(metaNumber(b))
}

// isCSpace is C's isspace in the C locale.
func isCSpace(c byte) bool {
	return c == ' ' || (c >= '\t' && c <= '\r')
}

// parseMetaDebug parses "me <key> [b]" as memcached 1.6.18 does: a b right after the key
// means a base64 key; anything else after the key is ignored.
func (d *TextReader) parseMetaDebug(toks [][]byte, req *Request) error {
	if len(toks) < 2 || len(toks[1]) > d.lim.MaxKeyBytes {
		return textErrBadFormat()
	}
	req.Op = OpMetaDebug
	m := &req.Meta
	m.KeyToken, req.Key = toks[1], toks[1]
	if len(toks) >= 3 && string(toks[2]) == "b" {
		key, ok := MetaDecodeKey(d.meta.key[:0], m.KeyToken)
		d.meta.key = key
		if !ok {
			return textErrBadFormat()
		}
		m.Base64, req.Key = true, key
		m.Flags = append(m.Flags, MetaFlag{Letter: 'b'})
	}
	return nil
}
