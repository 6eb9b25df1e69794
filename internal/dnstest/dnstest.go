// Package dnstest is a DNS server on loopback for tests: it answers A, AAAA and SRV
// questions from records the test sets and changes, NXDOMAIN for names it has none of, and
// nothing at all while silenced. It answers over UDP, which is all Go's resolver needs
// (net.Resolver with PreferGo and a Dial to its address); golang.org/x/net/dns/dnsmessage
// reads the questions and writes the answers.
package dnstest

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
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
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil, err
	}
	qs, err := p.AllQuestions()
	if err != nil {
		return nil, err
	}
	if len(qs) != 1 {
		return nil, errors.New("not a query of one question")
	}
	q := qs[0]

	name := fqdn(q.Name.String())
	s.mu.Lock()
	ips, ipsOK := s.ips[name]
	srvs, srvOK := s.srvs[name]
	s.mu.Unlock()
	reply := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true,
		RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	if !ipsOK && !srvOK {
		reply.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, reply)
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	if err := appendAnswers(&b, q, ips, srvs); err != nil {
		return nil, err
	}
	return b.Finish()
}

// appendAnswers adds the answers to q: the name's addresses of the type asked, or its SRV
// records.
func appendAnswers(b *dnsmessage.Builder, q dnsmessage.Question, ips []netip.Addr, srvs []SRV) error {
	rh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 1} // TTL 1: the tests change answers
	switch q.Type {
	case dnsmessage.TypeA, dnsmessage.TypeAAAA:
		for _, ip := range ips {
			var err error
			switch {
			case ip.Is4() && q.Type == dnsmessage.TypeA:
				err = b.AResource(rh, dnsmessage.AResource{A: ip.As4()})
			case !ip.Is4() && q.Type == dnsmessage.TypeAAAA:
				err = b.AAAAResource(rh, dnsmessage.AAAAResource{AAAA: ip.As16()})
			}
			if err != nil {
				return err
			}
		}
	case dnsmessage.TypeSRV:
		for _, r := range srvs {
			target, err := dnsmessage.NewName(fqdn(r.Target))
			if err != nil {
				return err
			}
			srv := dnsmessage.SRVResource{Priority: r.Priority, Weight: r.Weight, Port: r.Port, Target: target}
			if err := b.SRVResource(rh, srv); err != nil {
				return err
			}
		}
	}
	return nil
}
