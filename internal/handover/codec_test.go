package handover

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

// sampleMessages has one of every message, with values at their edges.
func sampleMessages() []struct {
	name string
	m    Message
} {
	return []struct {
		name string
		m    Message
	}{
		{"hello", Hello{Version: 1, PID: 4242}},
		{"hello max pid", Hello{Version: 7, PID: math.MaxInt32}},
		{"listeners", Listeners{Listeners: []Listener{
			{Addr: "127.0.0.1:11211", Kind: KindListen},
			{Addr: "/run/moxi/moxi.sock", Kind: KindListener},
			{Addr: "127.0.0.1:9151", Kind: KindAdmin},
		}}},
		{"no listeners", Listeners{Listeners: []Listener{}}},
		{"state", State{Sections: map[string]json.RawMessage{
			"standins":  json.RawMessage(`{"a":[1,2]}`),
			"health":    json.RawMessage(`[]`),
			"discovery": json.RawMessage(`null`),
			"empty":     nil,
		}}},
		{"no state", State{Sections: map[string]json.RawMessage{}}},
		{"conns", Conns{Conns: []ConnRecord{
			{Listener: "127.0.0.1:11211", Binary: true, Sniffed: true, User: "alice",
				Unread: []byte("get a b c\r\nset k 0 0 5\r\nhel"), KeyEstimate: -1, FailedLogins: 3, Affinity: math.MaxUint32},
			{Listener: "/run/moxi/moxi.sock", KeyEstimate: math.MaxInt64, FailedLogins: math.MinInt32},
			{Sniffed: true, Unread: bytes.Repeat([]byte{0x80}, 1000)},
		}}},
		{"ack", Ack{Count: 253}},
		{"ready", Ready{}},
		{"done", Done{}},
		{"fail", Fail{Reason: "config: line 3: pools: unknown key"}},
		{"fail without reason", Fail{}},
	}
}

func TestRoundTrip(t *testing.T) {
	for _, tc := range sampleMessages() {
		t.Run(tc.name, func(t *testing.T) {
			b, err := AppendMessage([]byte("prefix"), tc.m)
			if err != nil {
				t.Fatal(err)
			}
			b = b[len("prefix"):]
			got, n, err := ParseMessage(append(b, "next message"...))
			if err != nil {
				t.Fatal(err)
			}
			if n != len(b) {
				t.Errorf("took %d bytes, want %d", n, len(b))
			}
			if !reflect.DeepEqual(got, tc.m) {
				t.Errorf("got %#v\nwant %#v", got, tc.m)
			}
			// Every beginning of a message is short, never wrong.
			for i := range b {
				if _, _, err := ParseMessage(b[:i]); !errors.Is(err, ErrShort) {
					t.Fatalf("first %d of %d bytes: %v, want ErrShort", i, len(b), err)
				}
			}
		})
	}
}

func header(version uint16, t msgType, size uint32) []byte {
	b := []byte(magic)
	b = binary.BigEndian.AppendUint16(b, version)
	b = append(b, byte(t))
	return binary.BigEndian.AppendUint32(b, size)
}

func TestVersionMismatch(t *testing.T) {
	b, err := AppendMessage(nil, Hello{Version: Version, PID: 1})
	if err != nil {
		t.Fatal(err)
	}
	binary.BigEndian.PutUint16(b[len(magic):], Version+1)
	// Refused from the version alone: a successor of another format stops at once.
	for _, in := range [][]byte{b, b[:len(magic)+2]} {
		_, _, err := ParseMessage(in)
		if !errors.Is(err, ErrVersion) {
			t.Fatalf("%d bytes: %v, want ErrVersion", len(in), err)
		}
		if want := "unknown format version 2 (this moxi speaks 1)"; !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

func TestOversizedLengthRefusedFromHeader(t *testing.T) {
	for _, tc := range []struct {
		name string
		t    msgType
		size uint32
	}{
		{"state over 64 MiB", typeState, MaxStateBytes + 1},
		{"conns over 16 MiB", typeConns, MaxConnsBytes + 1},
		{"ack of 4 GiB", typeAck, math.MaxUint32},
		{"ready of 64 KiB+1", typeReady, maxControlBytes + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The header alone, as a reader has it before the payload: refused, not short.
			_, _, err := ParseMessage(header(Version, tc.t, tc.size))
			if !errors.Is(err, ErrTooLarge) {
				t.Fatalf("%v, want ErrTooLarge", err)
			}
		})
	}
}

func TestParseRefusesMalformed(t *testing.T) {
	withPayload := func(t msgType, p ...byte) []byte {
		return append(header(Version, t, uint32(len(p))), p...)
	}
	conn := func(flags byte, unread uint32) []byte {
		p := []byte{0, 1, 0, 0, flags, 0, 0}
		p = binary.BigEndian.AppendUint32(p, unread)
		return append(p, make([]byte, 16)...)
	}
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"bad magic", []byte("GET / HTTP/1.1\r\n")},
		{"bad magic, short", []byte("MXH!")},
		{"unknown type", header(Version, 0, 0)},
		{"unknown type 9", header(Version, 9, 0)},
		{"ready with a payload", withPayload(typeReady, 1)},
		{"hello with trailing bytes", withPayload(typeHello, 0, 1, 0, 0, 0, 1, 0)},
		{"hello pid over int32", withPayload(typeHello, 0, 1, 0x80, 0, 0, 0)},
		{"ack over MaxFDs", withPayload(typeAck, 0, 0, 0, 254)},
		{"listener of unknown kind", withPayload(typeListeners, 0, 1, 4, 0, 1, 'x')},
		{"listeners count past the payload", withPayload(typeListeners, 0xff, 0xff, 1, 0, 0)},
		{"listeners over MaxFDs", append(withPayload(typeListeners, 0, 254), make([]byte, 254*3)...)},
		{"conns count past the payload", withPayload(typeConns, 0, 2)},
		{"conn with unknown flags", withPayload(typeConns, conn(4, 0)...)},
		{"conn unread past the payload", withPayload(typeConns, conn(0, 1)...)},
		{"conn unread over 4 MiB", withPayload(typeConns, conn(0, MaxUnreadBytes+1)...)},
		{"state sections out of order", withPayload(typeState, 0, 2, 0, 1, 'b', 0, 0, 0, 0, 0, 1, 'a', 0, 0, 0, 0)},
		{"state section twice", withPayload(typeState, 0, 2, 0, 1, 'a', 0, 0, 0, 0, 0, 1, 'a', 0, 0, 0, 0)},
		{"state section without a name", withPayload(typeState, 0, 1, 0, 0, 0, 0, 0, 0)},
		{"state section past the payload", withPayload(typeState, 0, 1, 0, 1, 'a', 0xff, 0xff, 0xff, 0xff)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _, err := ParseMessage(tc.in)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("got %#v, %v; want ErrMalformed", m, err)
			}
		})
	}
}

func TestAppendRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    Message
	}{
		{"negative pid", Hello{PID: -1}},
		{"pid over int32", Hello{PID: math.MaxInt32 + 1}},
		{"254 listeners", Listeners{Listeners: make([]Listener, 254)}},
		{"listener without kind", Listeners{Listeners: []Listener{{Addr: "x"}}}},
		{"address over 64 KiB", Listeners{Listeners: []Listener{{Addr: strings.Repeat("x", 1<<16), Kind: KindListen}}}},
		{"section without a name", State{Sections: map[string]json.RawMessage{"": nil}}},
		{"state over 64 MiB", State{Sections: map[string]json.RawMessage{"a": make([]byte, MaxStateBytes/2), "b": make([]byte, MaxStateBytes/2)}}},
		{"254 conns", Conns{Conns: make([]ConnRecord, 254)}},
		{"unread over 4 MiB", Conns{Conns: []ConnRecord{{Unread: make([]byte, MaxUnreadBytes+1)}}}},
		{"conns over 16 MiB", Conns{Conns: []ConnRecord{{Unread: make([]byte, MaxUnreadBytes)}, {Unread: make([]byte, MaxUnreadBytes)}, {Unread: make([]byte, MaxUnreadBytes)}, {Unread: make([]byte, MaxUnreadBytes)}}}},
		{"ack of 254", Ack{Count: 254}},
		{"fail over 64 KiB", Fail{Reason: strings.Repeat("x", maxControlBytes+1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := []byte("kept")
			got, err := AppendMessage(dst, tc.m)
			if err == nil {
				t.Fatal("encoded")
			}
			if string(got) != "kept" {
				t.Errorf("dst became %d bytes, want it as it was", len(got))
			}
		})
	}
}
