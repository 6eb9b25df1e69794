package protocol

import (
	"bytes"
	"math"
	"strconv"
)

// textMaxTokens is how many tokens of a line are kept. No command other than a retrieval or
// stats (which read the line itself) takes more than 7, so an 8th only means "too many".
const textMaxTokens = 8

// The CLIENT_ERROR messages, worded as memcached 1.6 words them.
const (
	textMsgBadFormat  = "bad command line format"
	textMsgBadDelete  = "bad command line format.  Usage: delete <key> [noreply]"
	textMsgBadExptime = "invalid exptime argument"
	textMsgBadDelta   = "invalid numeric delta argument"
	textMsgTooLarge   = "object too large for cache"
	textMsgNonNumeric = "cannot increment or decrement non-numeric value"
	textMsgNoMemory   = "out of memory storing object"
	textMsgNoAnswer   = "no answer"
)

func textErrBadFormat() *RequestError {
	return &RequestError{Status: StatusInvalid, Msg: textMsgBadFormat}
}

func textErrClient(msg string) *RequestError {
	return &RequestError{Status: StatusInvalid, Msg: msg}
}

// textMsgServerAdmin is the answer to a memcached admin command that a proxy cannot carry
// out for the servers behind it.
func textMsgServerAdmin(cmd []byte) string {
	return "moxi is a proxy: send " + string(cmd) + " to each memcached server directly"
}

func textErrUnknown() *RequestError {
	return &RequestError{Status: StatusUnknownCommand}
}

// tokenize splits line into d.toks (see splitTokens). It returns the number of tokens
// kept, at most textMaxTokens.
func (d *TextReader) tokenize(line []byte) int { return splitTokens(line, d.toks[:]) }

// splitTokens splits line on spaces into toks, as memcached does (tabs and other bytes
// belong to tokens), and returns how many there are, counting at most len(toks).
func splitTokens(line []byte, toks [][]byte) int {
	n := 0
	for i := 0; i < len(line) && n < len(toks); {
		if line[i] == ' ' {
			i++
			continue
		}
		j := i
		for j < len(line) && line[j] != ' ' {
			j++
		}
		toks[n] = line[i:j]
		n++
		i = j
	}
	return n
}

// parse decodes one command line (and the data block of a storage command) into req.
func (d *TextReader) parse(line []byte, req *Request) error {
	n := d.tokenize(line)
	if n == 0 {
		return textErrUnknown()
	}
	toks := d.toks[:n]
	switch string(toks[0]) {
	case "get":
		return d.parseRetrieval(OpGet, line, req)
	case "gets":
		return d.parseRetrieval(OpGets, line, req)
	case "gat":
		return d.parseRetrieval(OpGat, line, req)
	case "gats":
		return d.parseRetrieval(OpGats, line, req)
	case "set":
		return d.parseStorage(OpSet, toks, req)
	case "add":
		return d.parseStorage(OpAdd, toks, req)
	case "replace":
		return d.parseStorage(OpReplace, toks, req)
	case "append":
		return d.parseStorage(OpAppend, toks, req)
	case "prepend":
		return d.parseStorage(OpPrepend, toks, req)
	case "cas":
		return d.parseStorage(OpCas, toks, req)
	case "delete":
		return d.parseDelete(toks, req)
	case "incr":
		return d.parseArithmetic(OpIncr, toks, req)
	case "decr":
		return d.parseArithmetic(OpDecr, toks, req)
	case "touch":
		return d.parseTouch(toks, req)
	case "flush_all":
		return parseTextFlushAll(toks, req)
	case "verbosity":
		return parseTextVerbosity(toks, req)
	case "version":
		req.Op = OpVersion
		return nil
	case "quit":
		req.Op = OpQuit
		return nil
	case "cache_memlimit":
		return parseTextMemlimit(toks, req)
	case "slabs":
		return parseTextSlabs(toks)
	case "lru", "lru_crawler":
		// memcached's server-admin commands: answered in memcached's form (clients wait
		// for a one-line answer, not for ERROR), saying that a proxy does not run them.
		return textErrClient(textMsgServerAdmin(toks[0]))
	case "watch":
		return textErrClient("watch commands not allowed") // memcached's answer with watch off
	case "shutdown":
		// memcached's answer without -A, whatever follows: a client cannot stop a proxy.
		return &RequestError{Status: StatusUnknownCommand, Line: "ERROR: shutdown not enabled"}
	case "mn":
		return d.parseMeta(OpMetaNoop, line, req)
	case "mg":
		return d.parseMeta(OpMetaGet, line, req)
	case "ms":
		return d.parseMeta(OpMetaSet, line, req)
	case "md":
		return d.parseMeta(OpMetaDelete, line, req)
	case "ma":
		return d.parseMeta(OpMetaArithmetic, line, req)
	case "me":
		return d.parseMetaDebug(toks, req)
	case "stats":
		req.Op = OpStats
		// Everything after the command, as typed, so "stats detail dump" keeps its shape.
		rest := bytes.TrimLeft(line, " ")[len("stats"):]
		if args := bytes.Trim(rest, " "); len(args) > 0 {
			req.Args = args
		}
		return nil
	}
	if last := textLastToken(line); bytes.HasPrefix(last, []byte("HTTP/")) {
		return ErrHTTPRequest
	}
	return textErrUnknown()
}

func textLastToken(line []byte) []byte {
	line = bytes.TrimRight(line, " ")
	return line[bytes.LastIndexByte(line, ' ')+1:]
}

// noreply reports whether the last token is "noreply", the test memcached applies before
// it checks the rest of the line: a malformed line ending in noreply gets no answer.
func textNoReply(toks [][]byte) bool {
	return string(toks[len(toks)-1]) == "noreply"
}

// validKey reports whether k is within the key length limit and free of the bytes that
// could not travel on through a text connection: NUL, CR and LF (a space never gets here,
// it splits tokens). memcached accepts every other byte, and clients use them (memcaslap's
// keys start with 0x10 bytes), so refusing more would refuse what the servers serve.
func (d *TextReader) validKey(k []byte) bool {
	if len(k) > d.lim.MaxKeyBytes {
		return false
	}
	for _, c := range k {
		if c == 0 || c == '\r' || c == '\n' {
			return false
		}
	}
	return true
}

// parseRetrieval reads get/gets/gat/gats: [exptime] key... Keys are taken from the whole
// line, not the token array, since there may be thousands.
func (d *TextReader) parseRetrieval(op Op, line []byte, req *Request) error {
	req.Op = op
	rest := bytes.TrimLeft(line, " ")
	rest = rest[len(op.String()):]
	first := true
	for len(rest) > 0 {
		if rest[0] == ' ' {
			rest = rest[1:]
			continue
		}
		i := bytes.IndexByte(rest, ' ')
		if i < 0 {
			i = len(rest)
		}
		tok := rest[:i]
		rest = rest[i:]
		if first && (op == OpGat || op == OpGats) {
			first = false
			exp, ok := textParseInt32(tok)
			if !ok {
				return textErrClient(textMsgBadExptime)
			}
			req.Exptime = exp
			continue
		}
		first = false
		if !d.validKey(tok) || len(req.Keys) == d.lim.MaxMultigetKeys {
			return textErrBadFormat()
		}
		req.Keys = append(req.Keys, tok)
	}
	if first {
		// "get" alone has too few tokens for memcached: ERROR, not CLIENT_ERROR.
		return textErrUnknown()
	}
	return nil
}

// parseStorage reads "set key flags exptime bytes [noreply]" (cas: "... bytes cas
// [noreply]") and then the data block.
func (d *TextReader) parseStorage(op Op, toks [][]byte, req *Request) error {
	req.Op = op
	want := 5
	if op == OpCas {
		want = 6
	}
	if len(toks) != want && len(toks) != want+1 {
		return textErrUnknown()
	}
	req.NoReply = textNoReply(toks)
	key := toks[1]
	if !d.validKey(key) {
		return textErrBadFormat()
	}
	flags, okFlags := textParseUint32(toks[2])
	exptime, okExp := textParseInt32(toks[3])
	size, okSize := textParseInt64(toks[4])
	if !okFlags || !okExp || !okSize {
		return textErrBadFormat()
	}
	if op == OpCas {
		cas, ok := textParseUint64(toks[5])
		if !ok {
			return textErrBadFormat()
		}
		req.Cas = cas
	}
	if size < 0 || size > math.MaxInt32-2 {
		return textErrBadFormat() // memcached's length is a 32-bit int with room for "\r\n"
	}
	if size > int64(d.lim.MaxValueBytes) {
		// memcached answers at once and swallows the block (and its "\r\n") afterwards.
		d.discard = size + 2
		e := &RequestError{Status: StatusTooLarge, Msg: textMsgTooLarge}
		if op == OpSet {
			d.key = append(d.key[:0], key...)
			e.Unlink = d.key
		}
		return e
	}
	req.Flags = flags
	req.Exptime = exptime
	// Reading the block may move r's buffer under the line, so the key is copied first.
	d.key = append(d.key[:0], key...)
	req.Key = d.key
	return d.readValue(req, int(size))
}

// parseDelete reads "delete key [0] [noreply]", the 0 being a hold time memcached no longer
// supports but still accepts.
func (d *TextReader) parseDelete(toks [][]byte, req *Request) error {
	req.Op = OpDelete
	if len(toks) < 2 || len(toks) > 4 {
		return textErrUnknown()
	}
	if len(toks) > 2 {
		zero := string(toks[2]) == "0"
		req.NoReply = textNoReply(toks)
		valid := (len(toks) == 3 && (zero || req.NoReply)) ||
			(len(toks) == 4 && zero && req.NoReply)
		if !valid {
			return textErrClient(textMsgBadDelete)
		}
	}
	if !d.validKey(toks[1]) {
		return textErrBadFormat()
	}
	req.Key = toks[1]
	return nil
}

// parseArithmetic reads "incr key delta [noreply]"; memcached ignores a 4th token that is
// not noreply.
func (d *TextReader) parseArithmetic(op Op, toks [][]byte, req *Request) error {
	req.Op = op
	if len(toks) != 3 && len(toks) != 4 {
		return textErrUnknown()
	}
	req.NoReply = textNoReply(toks)
	if !d.validKey(toks[1]) {
		return textErrBadFormat()
	}
	delta, ok := textParseUint64(toks[2])
	if !ok {
		return textErrClient(textMsgBadDelta)
	}
	req.Key = toks[1]
	req.Delta = delta
	return nil
}

// parseTouch reads "touch key exptime [noreply]".
func (d *TextReader) parseTouch(toks [][]byte, req *Request) error {
	req.Op = OpTouch
	if len(toks) != 3 && len(toks) != 4 {
		return textErrUnknown()
	}
	req.NoReply = textNoReply(toks)
	if !d.validKey(toks[1]) {
		return textErrBadFormat()
	}
	exptime, ok := textParseInt32(toks[2])
	if !ok {
		return textErrClient(textMsgBadExptime)
	}
	req.Key = toks[1]
	req.Exptime = exptime
	return nil
}

// parseTextFlushAll reads "flush_all [delay] [noreply]".
func parseTextFlushAll(toks [][]byte, req *Request) error {
	req.Op = OpFlushAll
	if len(toks) > 3 {
		return textErrUnknown()
	}
	req.NoReply = len(toks) > 1 && textNoReply(toks)
	plain := 1
	if req.NoReply {
		plain = 2
	}
	if len(toks) == plain {
		return nil
	}
	delay, ok := textParseInt32(toks[1])
	if !ok {
		return textErrClient(textMsgBadExptime)
	}
	req.Exptime = delay
	return nil
}

// parseTextVerbosity reads "verbosity level [noreply]".
func parseTextVerbosity(toks [][]byte, req *Request) error {
	req.Op = OpVerbosity
	if len(toks) != 2 && len(toks) != 3 {
		return textErrUnknown()
	}
	req.NoReply = textNoReply(toks)
	level, ok := textParseUint32(toks[1])
	if !ok {
		return textErrBadFormat()
	}
	req.Level = level
	return nil
}

// parseTextMemlimit parses "cache_memlimit <megabytes> [noreply]", with memcached's checks
// and answers.
func parseTextMemlimit(toks [][]byte, req *Request) error {
	req.NoReply = textNoReply(toks)
	if len(toks) < 2 {
		return textErrUnknown()
	}
	mb, ok := textParseUint32(toks[1])
	switch {
	case !ok:
		return textErrUnknown()
	case mb < 8:
		return &RequestError{Status: StatusInvalid, Line: "MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m"}
	case mb > 1_000_000_000:
		return &RequestError{Status: StatusInvalid, Line: "MEMLIMIT_ADJUST_FAILED input value is megabytes not bytes"}
	}
	req.Op, req.Delta = OpCacheMemlimit, uint64(mb)
	return nil
}

// parseTextSlabs answers "slabs …": memcached's checks of "slabs automove", then, for a
// command it would carry out, that a proxy does not.
func parseTextSlabs(toks [][]byte) error {
	switch {
	case len(toks) >= 3 && string(toks[1]) == "reassign":
	case len(toks) >= 3 && string(toks[1]) == "automove":
		if string(toks[2]) == "ratio" {
			if len(toks) < 4 {
				return textErrUnknown()
			}
			if _, err := strconv.ParseFloat(string(toks[3]), 64); err != nil {
				return textErrUnknown()
			}
			break
		}
		level, ok := textParseUint32(toks[2])
		if !ok {
			return textErrBadFormat()
		}
		if level > 2 {
			return textErrUnknown()
		}
	default:
		return textErrUnknown()
	}
	return textErrClient(textMsgServerAdmin(toks[0]))
}
