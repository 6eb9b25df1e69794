package backend

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/moxi-proxy/moxi/internal/auth"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// A server started with -S (memcached's SASL) serves a connection only once it has
// authenticated: it answers any other binary request "Auth failure." and closes the
// connection, and leaves the text protocol unanswered. So with SASL set every connection
// moxi opens to the server authenticates before anything else is sent on it, and what moxi
// would send in the text protocol (meta commands, cache_memlimit) is answered by moxi
// instead. Without SASL set, that "Auth failure." to an ordinary request says the server
// wants credentials moxi does not have.

// SASL is the user and password moxi authenticates as, with SASL PLAIN, on every
// connection to a server that requires it. The zero value: the server requires nothing.
// Comparable: it is part of what makes two servers alike (a new password, new connections).
type SASL struct {
	User     string
	Password string
}

// set reports whether the server requires authentication.
func (a SASL) set() bool { return a.User != "" }

// String names the user only: Options get printed (New's panic), and no output may hold
// the password.
func (a SASL) String() string {
	if !a.set() {
		return "none"
	}
	return "user " + a.User
}

// GoString is String, for %#v.
func (a SASL) GoString() string { return a.String() }

// saslOpaque marks the answer to moxi's SASL auth request.
const saslOpaque = 0x5341534c // "SASL"

// authError is a server's refusal to serve a connection for want of authentication:
// "Auth failure." to moxi's SASL PLAIN, or, when moxi has no credentials for the server,
// to an ordinary request. It is no passing fault of a connection: the server is marked dead
// at once, and probed until it accepts.
type authError struct {
	user string // what moxi authenticated as; "" when it has no credentials
	pool string // the server's pool, whose sasl section is at fault
}

func (e *authError) Error() string {
	if e.user == "" {
		return fmt.Sprintf("the server requires SASL authentication (pools.%s.sasl is not set)", e.pool)
	}
	return "SASL authentication failed as user " + e.user
}

func isAuthError(err error) bool {
	var ae *authError
	return errors.As(err, &ae)
}

// authenticate logs nc in as s's SASL user, within the connect timeout; it fails with an
// authError when the server refuses the credentials. The connection is used for nothing
// else until it returns nil.
func (s *Server) authenticate(ctx context.Context, nc net.Conn) error {
	_ = nc.SetDeadline(time.Now().Add(s.opts.ConnectTimeout))
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	err := s.exchangeSASL(nc)
	if !stop() {
		return context.Cause(ctx) // the deadline now set is ctx's: the connection is no use
	}
	if err != nil {
		return err
	}
	_ = nc.SetDeadline(time.Time{}) // from here on each read and write sets its own
	return nil
}

// exchangeSASL sends SASL PLAIN's one message and reads the server's answer to it.
func (s *Server) exchangeSASL(nc net.Conn) error {
	a := s.opts.SASL
	saslAuthOpcode, _ := protocol.BinaryOpcode(&protocol.Request{Op: protocol.OpSaslAuth})
	login := protocol.Request{Op: protocol.OpSaslAuth, Key: []byte(auth.Mechanisms), Value: auth.PlainMessage(a.User, []byte(a.Password)), Opaque: saslOpaque}
	h, resp, err := s.askOnce(nc, protocol.AppendBinaryRequest(nil, &login))
	if err != nil {
		return fmt.Errorf("SASL authentication: %w", err)
	}
	switch {
	case h.Opcode != saslAuthOpcode || h.Opaque != saslOpaque:
		return fmt.Errorf("SASL authentication: answered out of step (opcode %#x, opaque %#x)", h.Opcode, h.Opaque)
	case h.Status == protocol.BinStatusAuthError:
		return &authError{user: a.User, pool: s.opts.Pool}
	case h.Status != protocol.BinStatusOK:
		// memcached without -S answers "Unknown command": pools.<name>.sasl promises servers that require it.
		return fmt.Errorf("SASL authentication as user %s: the server answered %q (status %#x); is it running with -S?", a.User, resp.Msg, h.Status)
	}
	return nil
}

// refusal is the error an answer with header h stands for when it is no answer but the
// server refusing an unauthenticated connection (see the top of the file); nil otherwise.
// memcached -F refuses a flush with the same status, and that is an answer.
func (s *Server) refusal(h *protocol.BinaryResponseHeader) error {
	if h.Status != protocol.BinStatusAuthError || isFlush(h.Opcode) {
		return nil
	}
	return &authError{user: s.opts.SASL.User, pool: s.opts.Pool}
}

// isFlush reports whether opcode is flush_all's, loud or quiet.
func isFlush(opcode uint8) bool {
	flush := protocol.Request{Op: protocol.OpFlushAll}
	loud, _ := protocol.BinaryOpcode(&flush)
	flush.Quiet = true
	quiet, _ := protocol.BinaryOpcode(&flush)
	return opcode == loud || opcode == quiet
}

// binaryOnly is moxi's answer, on a server that requires SASL, to a request it would send
// in the text protocol, which such a server does not speak; what names the request ("meta
// commands are").
func binaryOnly(what string) protocol.Response {
	return protocol.Response{Status: protocol.StatusInvalid, Msg: what + " not available on this pool: its servers require SASL, which allows only the binary protocol"}
}
