package protocol

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// ErrBadMetaAnswer is wrapped by ReadMetaAnswer's error for an answer that is not one a
// memcached writes to a meta request: the connection is out of step and must be closed.
var ErrBadMetaAnswer = errors.New("protocol: bad meta answer")

// metaAnswerMinLine is the least ReadMetaAnswer accepts as the longest answer line,
// whatever the limits: a line carries a base64 key of MaxKeyBytes, an opaque and numbers.
const metaAnswerMinLine = 1024

// ReadMetaAnswer reads a memcached's answer to one meta request (sent without q, see
// AppendMetaRequest) into resp, after clearing it: VA HD EN NF NS EX MN with their return
// flags kept verbatim in resp.Meta.Flags and the value of VA in resp.Value, or an ERROR,
// CLIENT_ERROR or SERVER_ERROR line as resp.Status and resp.Msg. AppendTextResponse renders
// resp back into the very bytes the server sent (less what q suppresses).
//
// The bytes in resp are in one buffer allocated for this answer, so resp may outlive the
// next read. Lines are bounded by lim.MaxLineBytes (at least 1 KiB) and values by
// lim.MaxValueBytes before anything is allocated. The error is an I/O error, or wraps
// ErrBadMetaAnswer; either way the connection cannot be used further.
func ReadMetaAnswer(r *bufio.Reader, lim Limits, resp *Response) error {
	*resp = Response{}
	line, err := readAnswerLine(r, max(lim.MaxLineBytes, metaAnswerMinLine))
	if err != nil {
		return err
	}
	if len(line) < 2 {
		return fmt.Errorf("%w: %q", ErrBadMetaAnswer, line)
	}
	if parseAnswerError(line, resp) {
		return nil
	}
	code := metaCodeFromWire(line[:2])
	rest := line[2:]
	if code == MetaNone || (len(rest) > 0 && rest[0] != ' ') {
		return fmt.Errorf("%w: %q", ErrBadMetaAnswer, line)
	}
	resp.Status = code.Status()
	resp.Meta.Code = code
	if code != MetaVA {
		if len(rest) > 0 {
			resp.Meta.Flags = bytes.Clone(rest)
		}
		return nil
	}
	// "VA <length><flags>"
	if len(rest) < 2 || rest[1] < '0' || rest[1] > '9' {
		return fmt.Errorf("%w: %q", ErrBadMetaAnswer, line)
	}
	i := 1
	for i < len(rest) && rest[i] != ' ' {
		i++
	}
	n, ok := textParseInt64(rest[1:i])
	if !ok || n > int64(lim.MaxValueBytes) {
		return fmt.Errorf("%w: %q", ErrBadMetaAnswer, line)
	}
	flags := rest[i:]
	buf := make([]byte, len(flags)+int(n)+2)
	copy(buf, flags)
	if len(flags) > 0 {
		resp.Meta.Flags = buf[:len(flags):len(flags)]
	}
	value := buf[len(flags):]
	if _, err := io.ReadFull(r, value); err != nil {
		return textEOF(err)
	}
	if value[n] != '\r' || value[n+1] != '\n' {
		return fmt.Errorf("%w: VA value of %d bytes without its \\r\\n", ErrBadMetaAnswer, n)
	}
	resp.Value = value[:n:n]
	return nil
}

// ReadMetaAnswerFor reads the answer to a request sent with AppendMetaRequest into resp:
// what ReadMetaAnswer reads, but when the request was sent with its q and an mn
// (throughMN, see MetaThroughMN) it reads up to that mn's MN, and resp is then the answer
// memcached wrote (Vivified when N created the item) or, when q suppressed it, an HD that
// AppendTextResponse drops as q does.
func ReadMetaAnswerFor(r *bufio.Reader, lim Limits, throughMN bool, resp *Response) error {
	if err := ReadMetaAnswer(r, lim, resp); err != nil || !throughMN {
		return err
	}
	if resp.Meta.Code == MetaMN {
		*resp = Response{Meta: MetaAnswer{Code: MetaHD}}
		return nil
	}
	// Under q only an item N created answers HD or VA.
	resp.Meta.Vivified = resp.Meta.Code == MetaHD || resp.Meta.Code == MetaVA
	var mn Response
	if err := ReadMetaAnswer(r, lim, &mn); err != nil {
		return err
	}
	if mn.Meta.Code != MetaMN {
		return fmt.Errorf("%w: %s where the MN after a quiet ma was due", ErrBadMetaAnswer, mn.Meta.Code)
	}
	return nil
}

// parseAnswerError reads an ERROR, CLIENT_ERROR or SERVER_ERROR line into resp with the
// Status that renders it as it came, and reports whether line was one.
func parseAnswerError(line []byte, resp *Response) bool {
	switch {
	case string(line) == "ERROR":
		resp.Status = StatusUnknownCommand
	case bytes.HasPrefix(line, []byte("CLIENT_ERROR ")):
		resp.Msg = string(line[len("CLIENT_ERROR "):])
		resp.Status = StatusInvalid
		if resp.Msg == textMsgNonNumeric {
			resp.Status = StatusNonNumeric
		}
	case bytes.HasPrefix(line, []byte("SERVER_ERROR ")):
		resp.Msg = string(line[len("SERVER_ERROR "):])
		switch resp.Msg {
		case textMsgTooLarge:
			resp.Status = StatusTooLarge
		case textMsgNoMemory:
			resp.Status = StatusNoMemory
		default:
			resp.Status = StatusTempFailure
		}
	default:
		return false
	}
	return true
}

func metaCodeFromWire(b []byte) MetaCode {
	for c := MetaVA; c <= MetaME; c++ {
		if string(b) == c.String() {
			return c
		}
	}
	return MetaNone
}

// readAnswerLine returns the next line without its "\r\n", which it requires, reading at
// most limit bytes of it. The line is valid until the next read from r.
func readAnswerLine(r *bufio.Reader, limit int) ([]byte, error) {
	s, err := r.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		// Longer than r's buffer: collect it, bounded.
		long := append([]byte(nil), s...)
		for err == bufio.ErrBufferFull && len(long) <= limit+2 {
			s, err = r.ReadSlice('\n')
			long = append(long, s...)
		}
		s = long
	}
	if err != nil {
		if err == bufio.ErrBufferFull {
			return nil, fmt.Errorf("%w: line longer than %d bytes", ErrBadMetaAnswer, limit)
		}
		if len(s) > 0 {
			return nil, textEOF(err)
		}
		return nil, err
	}
	if len(s) > limit+2 {
		return nil, fmt.Errorf("%w: line longer than %d bytes", ErrBadMetaAnswer, limit)
	}
	if len(s) < 2 || s[len(s)-2] != '\r' {
		return nil, fmt.Errorf("%w: line %q without \\r\\n", ErrBadMetaAnswer, s)
	}
	return s[:len(s)-2], nil
}
