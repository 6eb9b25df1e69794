// Package handover is the wire protocol by which a running moxi hands its listening sockets,
// its memory and its client connections to the moxi that upgrades it, over an inherited
// Unix stream socket.
//
// A handover runs in this order (old is the running process, new its successor):
//
//	old → new  Hello                          new refuses a Version it does not speak
//	new → old  Hello
//	old → new  Listeners + their descriptors
//	old → new  State
//	new → old  Ready                          listeners taken, state applied, config loaded
//	old → new  Conns + descriptors, …         each batch answered by new with Ack (SendConns, RecvConns)
//	old → new  Done
//
// Either side may send Fail instead of what the other waits for; every message carries the
// format Version in its header, so a successor built for another format refuses the first
// message it reads, and the old process keeps serving. The package does no logging and
// keeps no state beyond a Channel; the caller sequences the messages and bounds the whole
// exchange with Channel.SetDeadline.
package handover

import (
	"encoding/json"
	"fmt"
)

// Version is the format version this package reads and writes. Change it with any change
// of the framing or of a payload's layout.
const Version uint16 = 1

// EnvFD is the environment variable by which the old process tells its successor the number
// of the descriptor holding its end of the handover socket.
const EnvFD = "MOXI_HANDOVER_FD"

// MaxFDs is the most descriptors one message carries: Linux's SCM_MAX_FD, the limit of one
// sendmsg. It bounds the listeners of a Listeners message and the records of a Conns batch.
const MaxFDs = 253

// Bounds on what a peer may make the other allocate. A message over its bound is refused
// from its header, before its payload is read.
const (
	MaxStateBytes   = 64 << 20 // a State message's payload
	MaxConnsBytes   = 16 << 20 // a Conns batch's payload
	MaxUnreadBytes  = 4 << 20  // one connection's unread input (limits.max_connection_bytes' default)
	maxControlBytes = 64 << 10 // every other message's payload
)

// Message is one of Hello, Listeners, State, Conns, Ack, Ready, Done and Fail; receivers
// tell them apart with a type switch. The set is closed: a new message is a new format
// Version.
type Message interface {
	msgType() msgType
}

// Hello opens the exchange in both directions.
type Hello struct {
	Version uint16 // the newest format version the sender speaks
	PID     int    // the sender's process id
}

// Listeners carries the listening sockets; the message's descriptors are theirs, one per
// Listener, in the same order.
type Listeners struct {
	Listeners []Listener
}

// Listener describes one handed-over listening socket.
type Listener struct {
	Addr string // the address as configured (host:port or a Unix socket path)
	Kind Kind
}

// Kind says which configured socket a Listener is.
type Kind uint8

// The kinds of listening socket.
const (
	KindListen   Kind = 1 // the main data listener, `listen`
	KindListener Kind = 2 // an extra data listener, an entry of `listeners`
	KindAdmin    Kind = 3 // the admin HTTP server, `admin`
)

func (k Kind) String() string {
	switch k {
	case KindListen:
		return "listen"
	case KindListener:
		return "listener"
	case KindAdmin:
		return "admin"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

func (k Kind) valid() bool { return k >= KindListen && k <= KindAdmin }

// State carries moxi's memory as named sections ("standins", "health", "discovery",
// "reshards", "hotkeys", …), each marshalled by its owner. The package carries a section's
// bytes as they are and never parses them.
type State struct {
	Sections map[string]json.RawMessage
}

// Conns is one batch of client connections; the message's descriptors are theirs, one per
// record, in the same order.
type Conns struct {
	Conns []ConnRecord
}

// ConnRecord is what the successor needs to go on serving a client connection from its
// next request.
type ConnRecord struct {
	Listener     string // the address of the listener that accepted it, as configured
	Binary       bool   // speaks the binary protocol
	Sniffed      bool   // its protocol has been told from its first byte
	User         string // the authenticated user; "" when none
	Unread       []byte // what the client sent that was not decoded yet; at most MaxUnreadBytes
	KeyEstimate  int64  // per-key answer estimate
	FailedLogins int32
	Affinity     uint32 // backend affinity
}

// Ack acknowledges a Conns batch of Count connections: the receiver owns them from then on.
type Ack struct {
	Count int
}

// Ready says the successor has taken the listeners and applied the state.
type Ready struct{}

// Done ends the handover: the sender has nothing more to hand over.
type Done struct{}

// Fail ends the handover with the sender's reason. Fail is an error, so a receiver may
// return the Fail it received.
type Fail struct {
	Reason string
}

func (f Fail) Error() string { return "handover: peer failed: " + f.Reason }

// msgType is the type byte of a message's header.
type msgType uint8

const (
	typeHello msgType = 1 + iota
	typeListeners
	typeState
	typeConns
	typeAck
	typeReady
	typeDone
	typeFail
)

func (Hello) msgType() msgType     { return typeHello }
func (Listeners) msgType() msgType { return typeListeners }
func (State) msgType() msgType     { return typeState }
func (Conns) msgType() msgType     { return typeConns }
func (Ack) msgType() msgType       { return typeAck }
func (Ready) msgType() msgType     { return typeReady }
func (Done) msgType() msgType      { return typeDone }
func (Fail) msgType() msgType      { return typeFail }

var typeNames = [...]string{typeHello: "Hello", typeListeners: "Listeners", typeState: "State",
	typeConns: "Conns", typeAck: "Ack", typeReady: "Ready", typeDone: "Done", typeFail: "Fail"}

func (t msgType) String() string {
	if int(t) < len(typeNames) && typeNames[t] != "" {
		return typeNames[t]
	}
	return fmt.Sprintf("type %d", uint8(t))
}

// maxPayload is the bound on a message type's payload; 0 for an unknown type.
func (t msgType) maxPayload() int {
	switch t {
	case typeState:
		return MaxStateBytes
	case typeConns:
		return MaxConnsBytes
	case typeHello, typeListeners, typeAck, typeReady, typeDone, typeFail:
		return maxControlBytes
	}
	return 0
}

// fds is how many descriptors a message carries.
func fds(m Message) int {
	switch m := m.(type) {
	case Listeners:
		return len(m.Listeners)
	case Conns:
		return len(m.Conns)
	}
	return 0
}
