package protocol

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
)

// Binary protocol framing (memcached's protocol_binary.h): a 24-byte header, then extras,
// key and value, in that order, their total length given by the header's body length.
const (
	binMagicRequest  = 0x80
	binMagicResponse = 0x81
	binHeaderLen     = 24
)

// The request opcodes moxi decodes. Anything else (range ops, ...) is answered
// "Unknown command" and its body skipped.
const (
	binOpGet       = 0x00
	binOpSet       = 0x01
	binOpAdd       = 0x02
	binOpReplace   = 0x03
	binOpDelete    = 0x04
	binOpIncr      = 0x05
	binOpDecr      = 0x06
	binOpQuit      = 0x07
	binOpFlush     = 0x08
	binOpGetQ      = 0x09
	binOpNoop      = 0x0a
	binOpVersion   = 0x0b
	binOpGetK      = 0x0c
	binOpGetKQ     = 0x0d
	binOpAppend    = 0x0e
	binOpPrepend   = 0x0f
	binOpStat      = 0x10
	binOpSetQ      = 0x11
	binOpAddQ      = 0x12
	binOpReplaceQ  = 0x13
	binOpDeleteQ   = 0x14
	binOpIncrQ     = 0x15
	binOpDecrQ     = 0x16
	binOpQuitQ     = 0x17
	binOpFlushQ    = 0x18
	binOpAppendQ   = 0x19
	binOpPrependQ  = 0x1a
	binOpVerbosity = 0x1b
	binOpTouch     = 0x1c
	binOpGat       = 0x1d
	binOpGatQ      = 0x1e
	binOpSaslList  = 0x20
	binOpSaslAuth  = 0x21
	binOpSaslStep  = 0x22
	binOpGatK      = 0x23
	binOpGatKQ     = 0x24
)

// ErrSASLOff is the answer to a SASL command where clients need not authenticate, as
// memcached without -S answers it.
var ErrSASLOff = &RequestError{Status: StatusUnknownCommand, Msg: binMsgUnknownCommand}

// binShape is the set of extras/key/body lengths a command accepts; memcached answers any
// other combination with "Invalid arguments" and closes the connection.
type binShape uint8

const (
	binShapeEmpty     binShape = iota // no extras, key or value: noop, version, quit
	binShapeFlush                     // optional 4-byte delay, nothing else
	binShapeKey                       // key only: get family, delete
	binShapeStat                      // optional key only: stat
	binShapeStore                     // flags+exptime extras, key, value: set, add, replace
	binShapeAppend                    // key and value: append, prepend
	binShapeIncr                      // delta+initial+exptime extras, key
	binShapeTouch                     // exptime extras, key: touch, gat family
	binShapeVerbosity                 // level extras only
	binShapeSASL                      // a mechanism as key, a message as value: sasl auth, sasl step
)

// binCommand describes one request opcode.
type binCommand struct {
	op      Op // OpInvalid: unknown opcode
	shape   binShape
	quiet   bool
	withKey bool
}

// binCommands is indexed by opcode. It is never written after initialisation.
var binCommands = [256]binCommand{
	binOpGet:       {op: OpGet, shape: binShapeKey},
	binOpGetQ:      {op: OpGet, shape: binShapeKey, quiet: true},
	binOpGetK:      {op: OpGet, shape: binShapeKey, withKey: true},
	binOpGetKQ:     {op: OpGet, shape: binShapeKey, quiet: true, withKey: true},
	binOpGat:       {op: OpGat, shape: binShapeTouch},
	binOpGatQ:      {op: OpGat, shape: binShapeTouch, quiet: true},
	binOpGatK:      {op: OpGat, shape: binShapeTouch, withKey: true},
	binOpGatKQ:     {op: OpGat, shape: binShapeTouch, quiet: true, withKey: true},
	binOpSet:       {op: OpSet, shape: binShapeStore},
	binOpSetQ:      {op: OpSet, shape: binShapeStore, quiet: true},
	binOpAdd:       {op: OpAdd, shape: binShapeStore},
	binOpAddQ:      {op: OpAdd, shape: binShapeStore, quiet: true},
	binOpReplace:   {op: OpReplace, shape: binShapeStore},
	binOpReplaceQ:  {op: OpReplace, shape: binShapeStore, quiet: true},
	binOpAppend:    {op: OpAppend, shape: binShapeAppend},
	binOpAppendQ:   {op: OpAppend, shape: binShapeAppend, quiet: true},
	binOpPrepend:   {op: OpPrepend, shape: binShapeAppend},
	binOpPrependQ:  {op: OpPrepend, shape: binShapeAppend, quiet: true},
	binOpDelete:    {op: OpDelete, shape: binShapeKey},
	binOpDeleteQ:   {op: OpDelete, shape: binShapeKey, quiet: true},
	binOpIncr:      {op: OpIncr, shape: binShapeIncr},
	binOpIncrQ:     {op: OpIncr, shape: binShapeIncr, quiet: true},
	binOpDecr:      {op: OpDecr, shape: binShapeIncr},
	binOpDecrQ:     {op: OpDecr, shape: binShapeIncr, quiet: true},
	binOpQuit:      {op: OpQuit, shape: binShapeEmpty},
	binOpQuitQ:     {op: OpQuit, shape: binShapeEmpty, quiet: true},
	binOpFlush:     {op: OpFlushAll, shape: binShapeFlush},
	binOpFlushQ:    {op: OpFlushAll, shape: binShapeFlush, quiet: true},
	binOpNoop:      {op: OpNoop, shape: binShapeEmpty},
	binOpVersion:   {op: OpVersion, shape: binShapeEmpty},
	binOpStat:      {op: OpStats, shape: binShapeStat},
	binOpVerbosity: {op: OpVerbosity, shape: binShapeVerbosity},
	binOpTouch:     {op: OpTouch, shape: binShapeTouch},
	binOpSaslList:  {op: OpSaslListMechs, shape: binShapeEmpty},
	binOpSaslAuth:  {op: OpSaslAuth, shape: binShapeSASL},
	binOpSaslStep:  {op: OpSaslStep, shape: binShapeSASL},
}

// valid reports whether the lengths fit the command's shape. Where memcached checks less
// (stat, touch and gat accept trailing body bytes, which it then parses as the next
// packet), moxi requires the body to be exactly extras+key(+value), so the stream never
// desynchronises.
func (s binShape) valid(extLen, keyLen, bodyLen int) bool {
	switch s {
	case binShapeEmpty:
		return bodyLen == 0
	case binShapeFlush:
		return keyLen == 0 && (extLen == 0 || extLen == 4) && bodyLen == extLen
	case binShapeKey:
		return extLen == 0 && keyLen > 0 && bodyLen == keyLen
	case binShapeStat:
		return extLen == 0 && bodyLen == keyLen
	case binShapeStore:
		return extLen == 8 && keyLen > 0
	case binShapeAppend:
		return extLen == 0 && keyLen > 0
	case binShapeIncr:
		return extLen == 20 && keyLen > 0 && bodyLen == extLen+keyLen
	case binShapeTouch:
		return extLen == 4 && keyLen > 0 && bodyLen == extLen+keyLen
	case binShapeVerbosity:
		return extLen == 4 && keyLen == 0 && bodyLen == extLen
	case binShapeSASL:
		return extLen == 0 && keyLen > 0
	}
	return false
}

// ErrBinaryMagic is returned by BinaryReader.Read and ReadBinaryResponse for a packet whose
// first byte is not the expected magic. memcached closes the connection without an answer.
var ErrBinaryMagic = errors.New("protocol: bad binary magic byte")

// binMaxScratch is the largest body buffer a BinaryReader keeps between requests: a client
// that once sent a big value does not pin that much memory for the rest of its connection.
const binMaxScratch = 64 << 10

// BinaryReader decodes binary-protocol requests from one client connection. It is not safe
// for concurrent use; the zero value is not usable, use NewBinaryReader.
type BinaryReader struct {
	r    *bufio.Reader
	lim  Limits
	hdr  [binHeaderLen]byte
	buf  []byte // body scratch, owned by the reader; Request slices point into it
	skip int64  // body bytes of a rejected packet still to be discarded by the next Read
}

// NewBinaryReader returns a reader of requests from r, rejecting keys and values over lim.
func NewBinaryReader(r *bufio.Reader, lim Limits) *BinaryReader {
	return &BinaryReader{r: r, lim: lim}
}

// Reset makes d read from r, forgetting any unread state of the previous connection.
func (d *BinaryReader) Reset(r *bufio.Reader) {
	d.r = r
	d.skip = 0
	if cap(d.buf) > binMaxScratch {
		d.buf = nil
	}
}

// Buffered is how many bytes of further requests are already in the reader: 0 means the
// next Read would wait for the client, so answers held back for batching must be sent now.
func (d *BinaryReader) Buffered() int {
	return max(0, d.r.Buffered()-int(min(d.skip, 1<<30)))
}

// Skipping reports whether d is dropping the body of a rejected packet that has not all
// arrived: the next Read goes on dropping it before it decodes anything.
func (d *BinaryReader) Skipping() bool { return d.skip > int64(d.r.Buffered()) }

// Read decodes the next request packet into req, after req.Reset(). The byte slices of req
// point into d's buffers and are valid until the next Read or Reset.
//
// A packet memcached answers with an error gives a *RequestError: req.Binary, Opcode,
// Opaque (and Quiet, WithKey for a known opcode) are filled so that AppendBinaryError can
// answer it, and Close says whether memcached closes the connection after the answer. When
// the connection stays open (unknown opcode, value too large) the packet's body is skipped
// by the next Read, after the answer has been written, as memcached swallows it. A wrong
// magic byte gives ErrBinaryMagic and any other error is an I/O error: close silently.
func (d *BinaryReader) Read(req *Request) error {
	req.Reset()
	for d.skip > 0 {
		n, err := d.r.Discard(int(min(d.skip, 1<<30)))
		d.skip -= int64(n)
		if err != nil {
			return binNoEOF(err)
		}
	}
	if cap(d.buf) > binMaxScratch {
		d.buf = nil
	}
	if _, err := io.ReadFull(d.r, d.hdr[:]); err != nil {
		return err
	}
	h := &d.hdr
	if h[0] != binMagicRequest {
		return ErrBinaryMagic
	}
	opcode := h[1]
	keyLen := int(binary.BigEndian.Uint16(h[2:4]))
	extLen := int(h[4])
	bodyLen := int64(binary.BigEndian.Uint32(h[8:12]))
	req.Binary = true
	req.Opcode = opcode
	req.Opaque = binary.BigEndian.Uint32(h[12:16])
	cas := binary.BigEndian.Uint64(h[16:24])

	if int64(keyLen+extLen) > bodyLen {
		return &RequestError{Status: StatusUnknownCommand, Msg: binMsgUnknownCommand, Close: true}
	}
	if keyLen > d.lim.MaxKeyBytes {
		return &RequestError{Status: StatusInvalid, Msg: binMsgInvalid, Close: true}
	}
	cmd := binCommands[opcode]
	if cmd.op == OpInvalid {
		d.skip = bodyLen
		return &RequestError{Status: StatusUnknownCommand, Msg: binMsgUnknownCommand}
	}
	req.Quiet = cmd.quiet
	req.WithKey = cmd.withKey
	if !cmd.shape.valid(extLen, keyLen, int(bodyLen)) {
		return &RequestError{Status: StatusInvalid, Msg: binMsgInvalid, Close: true}
	}
	valueLen := bodyLen - int64(extLen+keyLen)
	if valueLen > int64(d.lim.MaxValueBytes) {
		e := &RequestError{Status: StatusTooLarge, Msg: binMsgTooLarge}
		if cmd.op == OpSet && keyLen > 0 {
			// The key is wanted (memcached unlinks it); extras and key are bounded above.
			head := extLen + keyLen
			if cap(d.buf) < head {
				d.buf = make([]byte, head)
			}
			if _, err := io.ReadFull(d.r, d.buf[:head]); err != nil {
				return binNoEOF(err)
			}
			e.Unlink = d.buf[extLen:head]
			bodyLen -= int64(head)
		}
		d.skip = bodyLen
		return e
	}

	// bodyLen is now at most 255 + MaxKeyBytes + MaxValueBytes.
	body, err := readGrowing(d.r, d.buf, int(bodyLen))
	if err != nil {
		return binNoEOF(err)
	}
	d.buf = body[:0]
	ext := body[:extLen]
	var key []byte
	if keyLen > 0 {
		key = body[extLen : extLen+keyLen]
	}
	value := body[extLen+keyLen:]

	req.Op = cmd.op
	switch cmd.shape {
	case binShapeKey:
		if cmd.op == OpGet {
			req.Keys = append(req.Keys, key)
		} else { // delete
			req.Key = key
			req.Cas = cas
		}
	case binShapeStat:
		req.Args = key
	case binShapeStore:
		req.Key = key
		req.Value = value
		req.Flags = binary.BigEndian.Uint32(ext[0:4])
		req.Exptime = int64(binary.BigEndian.Uint32(ext[4:8]))
		req.Cas = cas
		if cmd.op == OpSet && cas != 0 {
			req.Op = OpCas
		}
	case binShapeAppend:
		req.Key = key
		req.Value = value
		req.Cas = cas
	case binShapeIncr:
		req.Key = key
		req.Delta = binary.BigEndian.Uint64(ext[0:8])
		req.Initial = binary.BigEndian.Uint64(ext[8:16])
		exp := binary.BigEndian.Uint32(ext[16:20])
		req.Exptime = int64(exp)
		req.Create = exp != binNoCreate
		req.Cas = cas
	case binShapeTouch:
		req.Exptime = int64(binary.BigEndian.Uint32(ext[0:4]))
		if cmd.op == OpGat {
			req.Keys = append(req.Keys, key)
		} else {
			req.Key = key
		}
	case binShapeFlush:
		if extLen == 4 {
			req.Exptime = int64(binary.BigEndian.Uint32(ext[0:4]))
		}
	case binShapeVerbosity:
		req.Level = binary.BigEndian.Uint32(ext[0:4])
	case binShapeSASL:
		req.Key = key
		req.Value = value
	}
	return nil
}

// binNoCreate is the incr/decr expiry that means "do not create a missing key".
const binNoCreate = 0xffffffff

// binNoEOF turns an EOF in the middle of a packet into io.ErrUnexpectedEOF, so only a
// connection closed between packets reads as a clean io.EOF.
func binNoEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
