// Package dnstest is a DNS server on loopback for tests: it answers A, AAAA and SRV
// questions from records the test sets and changes, NXDOMAIN for names it has none of, and
// nothing at all while silenced. It speaks just enough of RFC 1035 over UDP for Go's
// resolver (net.Resolver with PreferGo and a Dial to its address).
package dnstest

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Record types and classes of RFC 1035 and RFC 2782.
const (
	typeA    = 1
	typeAAAA = 28
	typeSRV  = 33
	classIN  = 1

	rcodeNXDomain = 3
)

// SRV is one SRV record.
type SRV struct {
	Target       string // a host name; a final dot is added when missing
	Port, Weight uint16
	Priority     uint16
}

// Server is a running DNS server. Its methods are safe for concurrent use.
type Server struct {
	Addr string // host:port, UDP

	conn    net.PacketConn
	mu      sync.Mutex
	ips     map[string][]netip.Addr // by lower-case name with its final dot
	srvs    map[string][]SRV
	silent  bool       // guarded by mu
	held    []question // asked while silent; guarded by mu
	queries atomic.Int64
}

// question is a query held while the server is silent, and who asked it.
type question struct {
	msg  []byte
	from net.Addr
}

// Start runs a server on a free loopback port until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	conn, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: conn.LocalAddr().String(), conn: conn, ips: map[string][]netip.Addr{}, srvs: map[string][]SRV{}}
	done := make(chan struct{})
	go func() { defer close(done); s.serve() }()
	t.Cleanup(func() { s.Silence(false); conn.Close(); <-done })
	return s
}

func fqdn(name string) string {
	name = strings.ToLower(name)
	if !strings.HasSuffix(name, ".") {
		name += "."
	}
	return name
}

// SetIPs makes name answer addrs (A and AAAA records); none: NXDOMAIN.
func (s *Server) SetIPs(name string, addrs ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ips []netip.Addr
	for _, a := range addrs {
		ips = append(ips, netip.MustParseAddr(a))
	}
	if len(ips) == 0 {
		delete(s.ips, fqdn(name))
		return
	}
	s.ips[fqdn(name)] = ips
}

// SetSRV makes name answer records; none: NXDOMAIN.
func (s *Server) SetSRV(name string, records ...SRV) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(records) == 0 {
		delete(s.srvs, fqdn(name))
		return
	}
	s.srvs[fqdn(name)] = records
}

// Silence makes the server leave every question unanswered (true), or answer again and
// answer the questions it held meanwhile, late (false).
func (s *Server) Silence(on bool) {
	s.mu.Lock()
	s.silent = on
	held := s.held
	if !on {
		s.held = nil
	}
	s.mu.Unlock()
	if !on {
		for _, q := range held {
			s.reply(q)
		}
	}
}

// Queries counts the questions received.
func (s *Server) Queries() int64 { return s.queries.Load() }

func (s *Server) serve() {
	buf := make([]byte, 1500)
	for {
		n, from, err := s.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		s.queries.Add(1)
		q := question{msg: append([]byte(nil), buf[:n]...), from: from}
		s.mu.Lock()
		silent := s.silent
		if silent {
			s.held = append(s.held, q)
		}
		s.mu.Unlock()
		if !silent {
			s.reply(q)
		}
	}
}

func (s *Server) reply(q question) {
	if out, err := s.answer(q.msg); err == nil {
		_, _ = s.conn.WriteTo(out, q.from)
	}
}

// answer is the reply to query: its header and question, and the records of the name.
func (s *Server) answer(query []byte) ([]byte, error) {
	if len(query) < 12 || binary.BigEndian.Uint16(query[4:6]) != 1 {
		return nil, errors.New("not a query of one question")
	}
	name, end, err := readName(query, 12)
	if err != nil || end+4 > len(query) {
		return nil, errors.New("bad question")
	}
	qtype := binary.BigEndian.Uint16(query[end : end+2])
	out := append([]byte(nil), query[:end+4]...)
	out[2] = 0x84 | query[2]&0x01 // QR, AA, the query's RD
	out[3] = 0x80                 // RA, NOERROR
	binary.BigEndian.PutUint16(out[6:8], 0)
	binary.BigEndian.PutUint16(out[8:10], 0)
	binary.BigEndian.PutUint16(out[10:12], 0)

	s.mu.Lock()
	ips, ipsOK := s.ips[fqdn(name)]
	srvs, srvOK := s.srvs[fqdn(name)]
	s.mu.Unlock()
	if !ipsOK && !srvOK {
		out[3] |= rcodeNXDomain
		return out, nil
	}
	count := 0
	record := func(typ uint16, rdata []byte) {
		out = append(out, 0xc0, 12) // the question's name
		out = binary.BigEndian.AppendUint16(out, typ)
		out = binary.BigEndian.AppendUint16(out, classIN)
		out = binary.BigEndian.AppendUint32(out, 1) // TTL: the tests change answers
		out = binary.BigEndian.AppendUint16(out, uint16(len(rdata)))
		out = append(out, rdata...)
		count++
	}
	switch qtype {
	case typeA, typeAAAA:
		for _, ip := range ips {
			if ip.Is4() == (qtype == typeA) {
				record(qtype, ip.AsSlice())
			}
		}
	case typeSRV:
		for _, r := range srvs {
			rdata := binary.BigEndian.AppendUint16(nil, r.Priority)
			rdata = binary.BigEndian.AppendUint16(rdata, r.Weight)
			rdata = binary.BigEndian.AppendUint16(rdata, r.Port)
			record(typeSRV, appendName(rdata, fqdn(r.Target)))
		}
	}
	binary.BigEndian.PutUint16(out[6:8], uint16(count))
	return out, nil
}

// readName reads the uncompressed name at off (a question's) and returns it with the
// offset after it.
func readName(msg []byte, off int) (string, int, error) {
	var labels []string
	for {
		if off >= len(msg) {
			return "", 0, errors.New("name runs past the message")
		}
		n := int(msg[off])
		off++
		if n == 0 {
			return strings.Join(labels, ".") + ".", off, nil
		}
		if n > 63 || off+n > len(msg) {
			return "", 0, errors.New("bad label")
		}
		labels = append(labels, string(msg[off:off+n]))
		off += n
	}
}

// appendName appends name (with its final dot) in labels.
func appendName(b []byte, name string) []byte {
	for _, label := range strings.Split(strings.TrimSuffix(name, "."), ".") {
		b = append(b, byte(len(label)))
		b = append(b, label...)
	}
	return append(b, 0)
}
