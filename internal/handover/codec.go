package handover

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
)

// A message is a header followed by its payload. The header is the magic "MXHO", the format
// Version (uint16), the message type (uint8) and the payload's length (uint32), big-endian.
// Payloads are binary, big-endian: a string or byte slice is its length (uint16 for names,
// addresses and users, uint32 for state sections and unread input) followed by its bytes.
// Every value has one encoding, so what ParseMessage accepts AppendMessage writes back
// byte for byte.
const (
	magic     = "MXHO"
	headerLen = len(magic) + 2 + 1 + 4
)

// Errors of ParseMessage and Recv; the returned errors wrap them with the detail.
var (
	// ErrShort means b holds only the beginning of a message: read more and parse again.
	ErrShort = errors.New("handover: incomplete message")
	// ErrVersion means the peer speaks another format version.
	ErrVersion = errors.New("handover: unknown format version")
	// ErrTooLarge means a message's length is over its type's bound.
	ErrTooLarge = errors.New("handover: message too large")
	// ErrMalformed means the bytes are not a message of this format.
	ErrMalformed = errors.New("handover: malformed message")
)

// AppendMessage appends m's encoding to dst. On error dst is returned as it was.
func AppendMessage(dst []byte, m Message) ([]byte, error) {
	start := len(dst)
	dst = append(dst, magic...)
	dst = binary.BigEndian.AppendUint16(dst, Version)
	dst = append(dst, byte(m.msgType()))
	dst = append(dst, 0, 0, 0, 0) // the payload's length, set below
	dst, err := appendPayload(dst, m)
	if err != nil {
		return dst[:start], fmt.Errorf("handover: encode %T: %w", m, err)
	}
	n := len(dst) - start - headerLen
	if n > m.msgType().maxPayload() {
		return dst[:start], fmt.Errorf("%w: %T of %d bytes, at most %d", ErrTooLarge, m, n, m.msgType().maxPayload())
	}
	binary.BigEndian.PutUint32(dst[start+headerLen-4:], uint32(n))
	return dst, nil
}

// ParseMessage decodes the message at the start of b and returns it with the number of bytes
// it took. When b holds only a beginning of a message, the error is ErrShort; a header
// that is refused (another Version, a length over its bound) is refused as soon as b holds
// it, before its payload. The returned message's byte slices (State sections, Unread) alias
// b.
func ParseMessage(b []byte) (m Message, n int, err error) {
	t, size, err := parseHeader(b)
	if err != nil {
		return nil, 0, err
	}
	if len(b) < headerLen+size {
		return nil, 0, ErrShort
	}
	m, err = parsePayload(t, b[headerLen:headerLen+size])
	if err != nil {
		return nil, 0, err
	}
	return m, headerLen + size, nil
}

// parseHeader checks the header at the start of b, as much of it as b holds, and returns the
// message type and payload length.
func parseHeader(b []byte) (msgType, int, error) {
	if got := b[:min(len(b), len(magic))]; string(got) != magic[:len(got)] {
		return 0, 0, fmt.Errorf("%w: no magic %q at its start", ErrMalformed, magic)
	}
	if len(b) < len(magic)+2 {
		return 0, 0, ErrShort
	}
	if v := binary.BigEndian.Uint16(b[len(magic):]); v != Version {
		return 0, 0, fmt.Errorf("%w %d (this moxi speaks %d)", ErrVersion, v, Version)
	}
	if len(b) < len(magic)+3 {
		return 0, 0, ErrShort
	}
	t := msgType(b[len(magic)+2])
	if t.maxPayload() == 0 {
		return 0, 0, fmt.Errorf("%w: unknown message %v", ErrMalformed, t)
	}
	if len(b) < headerLen {
		return 0, 0, ErrShort
	}
	size := binary.BigEndian.Uint32(b[headerLen-4:])
	if size > uint32(t.maxPayload()) {
		return 0, 0, fmt.Errorf("%w: %v of %d bytes, at most %d", ErrTooLarge, t, size, t.maxPayload())
	}
	return t, int(size), nil
}

func appendPayload(b []byte, m Message) ([]byte, error) {
	var err error
	switch m := m.(type) {
	case Hello:
		if m.PID < 0 || m.PID > math.MaxInt32 {
			return b, fmt.Errorf("pid %d out of range", m.PID)
		}
		b = binary.BigEndian.AppendUint16(b, m.Version)
		b = binary.BigEndian.AppendUint32(b, uint32(m.PID))
	case Listeners:
		if len(m.Listeners) > MaxFDs {
			return b, fmt.Errorf("%d listeners, at most %d", len(m.Listeners), MaxFDs)
		}
		b = binary.BigEndian.AppendUint16(b, uint16(len(m.Listeners)))
		for _, l := range m.Listeners {
			if !l.Kind.valid() {
				return b, fmt.Errorf("listener %q: unknown kind %d", l.Addr, l.Kind)
			}
			b = append(b, byte(l.Kind))
			if b, err = appendString16(b, l.Addr); err != nil {
				return b, err
			}
		}
	case State:
		if len(m.Sections) > math.MaxUint16 {
			return b, fmt.Errorf("%d sections, at most %d", len(m.Sections), math.MaxUint16)
		}
		b = binary.BigEndian.AppendUint16(b, uint16(len(m.Sections)))
		// Sorted, so that a state has one encoding.
		for _, name := range slices.Sorted(maps.Keys(m.Sections)) {
			if name == "" {
				return b, errors.New("a section without a name")
			}
			if b, err = appendString16(b, name); err != nil {
				return b, err
			}
			data := m.Sections[name]
			if len(data) > MaxStateBytes {
				return b, fmt.Errorf("section %q of %d bytes, at most %d", name, len(data), MaxStateBytes)
			}
			b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
			b = append(b, data...)
		}
	case Conns:
		if len(m.Conns) > MaxFDs {
			return b, fmt.Errorf("%d connections, at most %d", len(m.Conns), MaxFDs)
		}
		b = binary.BigEndian.AppendUint16(b, uint16(len(m.Conns)))
		for i := range m.Conns {
			if b, err = appendConnRecord(b, &m.Conns[i]); err != nil {
				return b, fmt.Errorf("connection %d: %w", i, err)
			}
		}
	case Ack:
		if m.Count < 0 || m.Count > MaxFDs {
			return b, fmt.Errorf("ack of %d, at most %d", m.Count, MaxFDs)
		}
		b = binary.BigEndian.AppendUint32(b, uint32(m.Count))
	case Ready, Done:
	case Fail:
		b = append(b, m.Reason...)
	default:
		return b, fmt.Errorf("unknown message %T", m)
	}
	return b, nil
}

// Record flags.
const (
	flagBinary  = 1 << 0
	flagSniffed = 1 << 1
)

// connRecordSize is the length of r's encoding.
func connRecordSize(r *ConnRecord) int {
	return 2 + len(r.Listener) + 1 + 2 + len(r.User) + 4 + len(r.Unread) + 8 + 4 + 4
}

func appendConnRecord(b []byte, r *ConnRecord) ([]byte, error) {
	var err error
	if b, err = appendString16(b, r.Listener); err != nil {
		return b, err
	}
	var flags byte
	if r.Binary {
		flags |= flagBinary
	}
	if r.Sniffed {
		flags |= flagSniffed
	}
	b = append(b, flags)
	if b, err = appendString16(b, r.User); err != nil {
		return b, err
	}
	if len(r.Unread) > MaxUnreadBytes {
		return b, fmt.Errorf("%d unread bytes, at most %d", len(r.Unread), MaxUnreadBytes)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.Unread)))
	b = append(b, r.Unread...)
	b = binary.BigEndian.AppendUint64(b, uint64(r.KeyEstimate))
	b = binary.BigEndian.AppendUint32(b, uint32(r.FailedLogins))
	b = binary.BigEndian.AppendUint32(b, r.Affinity)
	return b, nil
}

func appendString16(b []byte, s string) ([]byte, error) {
	if len(s) > math.MaxUint16 {
		return b, fmt.Errorf("a string of %d bytes, at most %d", len(s), math.MaxUint16)
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...), nil
}

// parsePayload decodes a payload of type t; it must be taken whole.
func parsePayload(t msgType, p []byte) (Message, error) {
	r := payloadReader{p: p}
	var m Message
	switch t {
	case typeHello:
		h := Hello{Version: r.uint16()}
		pid := r.uint32()
		if pid > math.MaxInt32 {
			r.fail("pid %d out of range", pid)
		}
		h.PID = int(pid)
		m = h
	case typeListeners:
		n := r.count(MaxFDs, 3)
		ls := Listeners{Listeners: make([]Listener, 0, n)}
		for range n {
			l := Listener{Kind: Kind(r.uint8())}
			l.Addr = r.string16()
			if r.err == nil && !l.Kind.valid() {
				r.fail("listener %q: unknown kind %d", l.Addr, l.Kind)
			}
			ls.Listeners = append(ls.Listeners, l)
		}
		m = ls
	case typeState:
		n := r.count(math.MaxUint16, 2+1+4)
		s := State{Sections: make(map[string]json.RawMessage, n)}
		prev := ""
		for range n {
			name := r.string16()
			data := r.bytes(int(r.uint32()))
			if r.err == nil && name <= prev {
				// Also refuses "" and repeats: names come sorted, as AppendMessage writes them.
				r.fail("section %q after %q", name, prev)
			}
			s.Sections[name] = data
			prev = name
		}
		m = s
	case typeConns:
		n := r.count(MaxFDs, connRecordSize(&ConnRecord{}))
		c := Conns{Conns: make([]ConnRecord, n)}
		for i := range c.Conns {
			r.connRecord(&c.Conns[i])
		}
		m = c
	case typeAck:
		count := r.uint32()
		if count > MaxFDs {
			r.fail("ack of %d, at most %d", count, MaxFDs)
		}
		m = Ack{Count: int(count)}
	case typeReady:
		m = Ready{}
	case typeDone:
		m = Done{}
	case typeFail:
		m = Fail{Reason: string(r.bytes(len(p)))}
	}
	if r.err == nil && len(r.p) > 0 {
		r.fail("%d bytes after the payload", len(r.p))
	}
	if r.err != nil {
		return nil, fmt.Errorf("%w: %v: %v", ErrMalformed, t, r.err)
	}
	return m, nil
}

// payloadReader decodes a payload from its front; the first error sticks and every later
// read returns zero values.
type payloadReader struct {
	p   []byte // what is not read yet
	err error
}

func (r *payloadReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf(format, args...)
	}
}

func (r *payloadReader) bytes(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.p) {
		r.fail("%d bytes claimed, %d left", n, len(r.p))
		return nil
	}
	b := r.p[:n:n]
	r.p = r.p[n:]
	if n == 0 {
		return nil
	}
	return b
}

func (r *payloadReader) uint8() uint8 {
	if b := r.bytes(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *payloadReader) uint16() uint16 {
	if b := r.bytes(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (r *payloadReader) uint32() uint32 {
	if b := r.bytes(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (r *payloadReader) uint64() uint64 {
	if b := r.bytes(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (r *payloadReader) string16() string {
	return string(r.bytes(int(r.uint16())))
}

// count reads a uint16 element count, refusing more than max or more than the rest of the
// payload could hold at minSize bytes each, so that nothing is allocated for elements that
// are not there.
func (r *payloadReader) count(max, minSize int) int {
	n := int(r.uint16())
	if n > max || n*minSize > len(r.p) {
		r.fail("%d elements, at most %d in %d bytes", n, max, len(r.p))
		return 0
	}
	return n
}

func (r *payloadReader) connRecord(c *ConnRecord) {
	c.Listener = r.string16()
	flags := r.uint8()
	if flags&^(flagBinary|flagSniffed) != 0 {
		r.fail("unknown flags %#x", flags)
	}
	c.Binary = flags&flagBinary != 0
	c.Sniffed = flags&flagSniffed != 0
	c.User = r.string16()
	n := r.uint32()
	if n > MaxUnreadBytes {
		r.fail("%d unread bytes, at most %d", n, MaxUnreadBytes)
	}
	c.Unread = r.bytes(int(n))
	c.KeyEstimate = int64(r.uint64())
	c.FailedLogins = int32(r.uint32())
	c.Affinity = r.uint32()
}
