package protocol

import (
	"bufio"
	"bytes"
	"errors"
	"io"
)

// ErrLineTooLong is returned by TextReader.Read for a command line (other than a retrieval)
// longer than Limits.MaxLineBytes. memcached closes such a connection without a word, so the
// caller closes it silently too.
var ErrLineTooLong = errors.New("protocol: text command line too long")

// ErrHTTPRequest is returned by TextReader.Read for an unknown command whose last token
// starts with "HTTP/": memcached hangs up on a web client without answering.
var ErrHTTPRequest = errors.New("protocol: HTTP request on the memcached port")

// textMaxKeptScratch is the largest scratch buffer a TextReader keeps between requests: a rare
// huge line or value must not stay pinned to an idle connection.
const textMaxKeptScratch = 64 << 10

// TextReader decodes text-protocol requests from one client connection.
// It is not safe for concurrent use; it is owned by the connection's read loop.
type TextReader struct {
	r   *bufio.Reader
	lim Limits

	// discard is the number of bytes to drop from r before the next request: the data
	// block of the previous request, left in r's buffer so its Value could point there, or
	// a rejected block that memcached "swallows" after answering.
	discard int64

	line  []byte                // a command line longer than r's buffer, accumulated
	key   []byte                // a storage command's key, copied before the data block moves r's buffer
	value []byte                // a data block longer than r's buffer
	toks  [textMaxTokens][]byte // the tokens of the current line
	meta  metaScratch           // meta commands' copies of their line and key
}

// NewTextReader returns a decoder reading from r and enforcing lim.
func NewTextReader(r *bufio.Reader, lim Limits) *TextReader {
	return &TextReader{r: r, lim: lim}
}

// Reset makes d read from r, forgetting any state of the previous reader, so a TextReader
// can be pooled with the bufio.Reader it wraps.
func (d *TextReader) Reset(r *bufio.Reader) {
	d.r = r
	d.discard = 0
	d.dropLargeScratch()
}

// Buffered is how many bytes of further requests are already in the reader: 0 means the
// next Read would wait for the client, so answers held back for batching must be sent now.
func (d *TextReader) Buffered() int {
	return max(0, d.r.Buffered()-int(min(d.discard, 1<<30)))
}

// Skipping reports whether d is dropping the data block of a rejected request that has
// not all arrived: the next Read goes on dropping it before it decodes anything.
func (d *TextReader) Skipping() bool { return d.discard > int64(d.r.Buffered()) }

// Read decodes the next request into req, after req.Reset.
//
// It returns a *RequestError for a request memcached answers with ERROR, CLIENT_ERROR or
// SERVER_ERROR (render it with AppendTextError; Close is set when memcached then closes the
// connection). ErrLineTooLong, ErrHTTPRequest and I/O errors (io.EOF, ...) mean the
// connection is to be closed without an answer. A rejected request that carried noreply is
// skipped silently, as memcached does, and the next one is read.
//
// The byte slices in req point into d's buffers and the bufio.Reader's and are valid only
// until the next call of Read or Reset. A retrieval may have no keys ("gat 0"), which
// memcached answers with a bare END.
func (d *TextReader) Read(req *Request) error {
	for {
		err := d.read(req)
		if re, ok := err.(*RequestError); ok && req.NoReply && !re.Close {
			continue
		}
		return err
	}
}

func (d *TextReader) read(req *Request) error {
	req.Reset()
	// The previous request is done with, so its big buffers can go before we block.
	d.dropLargeScratch()
	if err := d.skip(); err != nil {
		return err
	}
	line, err := d.readLine()
	if err != nil {
		return err
	}
	return d.parse(line, req)
}

func (d *TextReader) dropLargeScratch() {
	if cap(d.line) > textMaxKeptScratch {
		d.line = nil
	}
	if cap(d.value) > textMaxKeptScratch {
		d.value = nil
	}
}

// skip drops d.discard bytes, in steps that fit an int on any platform.
func (d *TextReader) skip() error {
	for d.discard > 0 {
		n := d.discard
		if n > 1<<30 {
			n = 1 << 30
		}
		m, err := d.r.Discard(int(n))
		d.discard -= int64(m)
		if err != nil {
			return textEOF(err)
		}
	}
	return nil
}

// readLine returns the next line without its "\n" and, as memcached does, without one "\r"
// before it when the line has something else in it.
func (d *TextReader) readLine() ([]byte, error) {
	s, err := d.nextSlice()
	if err == nil {
		line := textTrimEOL(s)
		// No limit is under MaxLineBytes: only a longer line asks which command it is.
		if len(line) > d.lim.MaxLineBytes && len(line) > d.lineLimit(line) {
			return nil, d.tooLong(line, true)
		}
		return line, nil
	}
	if err != bufio.ErrBufferFull {
		if len(s) > 0 {
			return nil, textEOF(err)
		}
		return nil, err
	}
	// The line is longer than r's buffer: collect it as it arrives, up to the limit for its
	// command, in pieces that cost what arrived; only a whole line is put together.
	limit := d.lineLimit(s)
	var p pieces
	defer p.release()
	p.write(s)
	for {
		if p.n > limit+1 { // +1: the "\r" not yet trimmed
			return nil, d.tooLong(p.chunks[0][:], false) // the command is in the first chunk
		}
		s, err = d.r.ReadSlice('\n')
		p.write(s)
		if err == nil {
			break
		}
		if err != bufio.ErrBufferFull {
			return nil, textEOF(err)
		}
	}
	d.line = p.appendTo(d.line[:0])
	line := textTrimEOL(d.line)
	if len(line) > limit {
		return nil, d.tooLong(line, true)
	}
	return line, nil
}

// nextSlice is bufio.Reader.ReadSlice('\n') that, like memcached, gives up on a line as
// soon as more of it than the limit for its command has arrived without its end, rather
// than waiting for a "\n" that a client sending garbage may never send.
func (d *TextReader) nextSlice() ([]byte, error) {
	for {
		n := d.r.Buffered()
		if n > 0 {
			b, _ := d.r.Peek(n)
			if i := bytes.IndexByte(b, '\n'); i >= 0 {
				_, _ = d.r.Discard(i + 1)
				return b[:i+1], nil // valid until the next read, as ReadSlice's
			}
			if n > d.lineLimit(b)+1 && !isTextRetrievalLine(b) {
				return nil, ErrLineTooLong
			}
		}
		if _, err := d.r.Peek(n + 1); err != nil {
			// Longer than the buffer (ErrBufferFull, which readLine handles), or the
			// input ended: ReadSlice reports it as it would have.
			return d.r.ReadSlice('\n')
		}
	}
}

// lineLimit is the longest line accepted for the command that line starts with: a
// retrieval may carry MaxMultigetKeys keys of MaxKeyBytes, anything else MaxLineBytes.
func (d *TextReader) lineLimit(line []byte) int {
	if isTextRetrievalLine(line) {
		return d.lim.MaxLineBytes + d.lim.MaxMultigetKeys*(d.lim.MaxKeyBytes+1)
	}
	return d.lim.MaxLineBytes
}

// tooLong rejects an over-long line. memcached hangs up on a long line that is not a
// get/gets; a retrieval that long must have too many keys or a key too long, which
// memcached answers with CLIENT_ERROR, so the rest of it is dropped and the connection
// stays usable.
func (d *TextReader) tooLong(line []byte, complete bool) error {
	if !isTextRetrievalLine(line) {
		return ErrLineTooLong
	}
	for !complete {
		_, err := d.r.ReadSlice('\n')
		if err == nil {
			break
		}
		if err != bufio.ErrBufferFull {
			return textEOF(err)
		}
	}
	return textErrBadFormat()
}

func isTextRetrievalLine(line []byte) bool {
	line = bytes.TrimLeft(line, " ")
	return bytes.HasPrefix(line, []byte("get ")) || bytes.HasPrefix(line, []byte("gets ")) ||
		bytes.HasPrefix(line, []byte("gat ")) || bytes.HasPrefix(line, []byte("gats "))
}

func textTrimEOL(s []byte) []byte {
	s = s[:len(s)-1]
	if len(s) > 1 && s[len(s)-1] == '\r' {
		s = s[:len(s)-1]
	}
	return s
}

// textEOF turns an EOF in the middle of a request into io.ErrUnexpectedEOF.
func textEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// readValue reads a data block of n bytes and its "\r\n" into req.Value. A block that fits
// r's buffer is left there (and dropped at the next Read) so the common case copies nothing.
func (d *TextReader) readValue(req *Request, n int) error {
	total := n + 2
	var b []byte
	if total <= d.r.Size() {
		p, err := d.r.Peek(total)
		if err != nil {
			return textEOF(err)
		}
		d.discard = int64(total)
		b = p
	} else {
		var err error
		if b, err = readGrowing(d.r, d.value, total); err != nil {
			return textEOF(err)
		}
		d.value = b[:0]
	}
	// memcached takes exactly n+2 bytes whatever they are, and answers a block without its
	// "\r\n" with CLIENT_ERROR; whatever follows is read as the next command.
	if b[n] != '\r' || b[n+1] != '\n' {
		return &RequestError{Status: StatusInvalid, Msg: "bad data chunk"}
	}
	req.Value = b[:n:n]
	return nil
}
