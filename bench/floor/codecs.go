//go:build linux

package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"slices"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

// With -codecs the floor does, in one flat pass per event, what moxi must do for each
// request in front of one server, and nothing more: it decodes the request with moxi's own
// decoders (protocol.TextReader, protocol.BinaryReader), encodes it as moxi sends it to
// memcached (text and binary clients: binary packets, protocol.AppendBinaryRequest; meta
// commands: on a meta connection, protocol.AppendMetaRequest), keeps what its answer needs,
// decodes the answer (protocol.ReadBinaryResponse, ReadMetaAnswerFor) and encodes the
// client's (AppendTextResponse, AppendTextRetrievalPart, AppendBinaryResponse). It hashes no
// key: with one server moxi's pool does not either (pool.Pool.Placement), and a floor of
// several would also have to put answers from several servers back in order. What it
// leaves out is all of moxi's features: timeouts, failover, bounds, fences, metrics, per-key
// state. Its figures are the floor of moxi's own request path.
type codecs struct {
	lim protocol.Limits

	feed bytes.Reader // what a decoder reads now: a client's or a backend's input
	br   *bufio.Reader
	text *protocol.TextReader
	bin  *protocol.BinaryReader
	req  protocol.Request
	resp [1]protocol.Response
	h    protocol.BinaryResponseHeader
	free []*pending
}

// pending is a request sent on to memcached whose answer a client waits for: what the
// client's answer is encoded from, its keys copied out of the input they were decoded from.
type pending struct {
	c       *client
	req     protocol.Request
	answers int  // packets still to come: one per key of a text retrieval
	quiet   bool // a binary quiet get (getq, getkq): memcached answers a hit only
	ended   bool // a retrieval's answer ended early on an error line: its later parts are dropped
	buf     []byte
	keys    [][]byte
	flags   []protocol.MetaFlag
}

func newCodecs() *codecs {
	cd := &codecs{lim: protocol.DefaultLimits(), br: bufio.NewReaderSize(nil, 64<<10)}
	cd.text = protocol.NewTextReader(cd.br, cd.lim)
	cd.bin = protocol.NewBinaryReader(cd.br, cd.lim)
	return cd
}

// decoder is what TextReader and BinaryReader have in common here.
type decoder interface {
	Read(req *protocol.Request) error
	Buffered() int
}

// incomplete reports whether err only says that the input ends inside a request or answer.
func incomplete(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// decodeRequests sends on c's complete requests, each to the backend its protocol takes.
func (l *loop) decodeRequests(c *client) {
	cd := l.codecs
	if !c.sniffed && len(c.in) > 0 {
		c.binary, c.sniffed = c.in[0] == 0x80, true
	}
	cd.feed.Reset(c.in)
	cd.br.Reset(&cd.feed)
	var dec decoder = cd.text
	if c.binary {
		cd.bin.Reset(cd.br)
		dec = cd.bin
	} else {
		cd.text.Reset(cd.br)
	}
	used := 0
	for {
		if err := dec.Read(&cd.req); err != nil {
			if !incomplete(err) {
				l.close(c) // the floor answers no malformed or refused request
				return
			}
			break
		}
		used = len(c.in) - cd.feed.Len() - dec.Buffered()
		l.send(c, &cd.req)
	}
	c.in = c.in[used:]
	if len(c.in) == 0 {
		c.in = c.in[:0:cap(c.in)]
	}
}

// send encodes req for memcached and, when an answer will come, keeps what
// the client's answer needs.
func (l *loop) send(c *client, req *protocol.Request) {
	cd := l.codecs
	meta := req.Op.IsMeta()
	b := l.backend(!meta)
	if len(b.out) == 0 {
		l.dirty = append(l.dirty, &b.stream)
	}
	at := len(b.out)
	answers := 1
	if meta {
		b.out = protocol.AppendMetaRequest(b.out, req)
	} else {
		b.out = protocol.AppendBinaryRequest(b.out, req)
		if req.Op.IsRetrieval() {
			answers = len(req.Keys)
		}
		if len(b.out) > at && quietWrite(b.out[at+1]) {
			answers = 0 // setq, or a text noreply: taken to succeed, as the plain floor does
		}
	}
	if answers > 0 {
		p := cd.keep(c, req, answers)
		p.quiet = req.Binary && req.Quiet && req.Op.IsRetrieval()
		b.pend = append(b.pend, p)
	}
}

// keep copies what req's answer is encoded from into a pending record.
func (cd *codecs) keep(c *client, req *protocol.Request, answers int) *pending {
	var p *pending
	if n := len(cd.free); n > 0 {
		p, cd.free = cd.free[n-1], cd.free[:n-1]
	} else {
		p = new(pending)
	}
	size := len(req.Key) + len(req.Meta.KeyToken)
	for _, k := range req.Keys {
		size += len(k)
	}
	for _, f := range req.Meta.Flags {
		size += len(f.Token)
	}
	p.buf = slices.Grow(p.buf[:0], size) // the copies never move
	p.c, p.answers, p.ended = c, answers, false
	p.req = *req
	p.req.Value, p.req.Args = nil, nil
	p.req.Key = p.own(req.Key)
	p.req.Meta.KeyToken = p.own(req.Meta.KeyToken)
	p.keys = p.keys[:0]
	for _, k := range req.Keys {
		p.keys = append(p.keys, p.own(k))
	}
	p.req.Keys = p.keys
	p.flags = append(p.flags[:0], req.Meta.Flags...)
	for i := range p.flags {
		p.flags[i].Token = p.own(p.flags[i].Token)
	}
	p.req.Meta.Flags = p.flags
	return p
}

func (p *pending) own(b []byte) []byte {
	if b == nil {
		return nil
	}
	at := len(p.buf)
	p.buf = append(p.buf, b...)
	return p.buf[at:len(p.buf):len(p.buf)]
}

// decodeAnswers gives b's complete answers to the clients waiting for them, in order.
func (l *loop) decodeAnswers(b *backend) {
	cd := l.codecs
	cd.feed.Reset(b.in)
	cd.br.Reset(&cd.feed)
	used := 0
	for len(b.pend) > 0 {
		p := b.pend[0]
		resp := &cd.resp[0]
		var err error
		if b.binary {
			err = protocol.ReadBinaryResponse(cd.br, cd.lim, &cd.h, resp)
		} else {
			err = protocol.ReadMetaAnswerFor(cd.br, cd.lim, protocol.MetaThroughMN(&p.req), resp)
		}
		if err != nil {
			if !incomplete(err) {
				check(err)
			}
			break
		}
		used = len(b.in) - cd.feed.Len() - cd.br.Buffered()
		// Quiet gets that this answer is not for were misses: memcached said nothing.
		for b.binary && p.quiet && cd.h.Opaque != p.req.Opaque && len(b.pend) > 1 {
			b.pend = b.pend[1:]
			p.c = nil
			cd.free = append(cd.free, p)
			p = b.pend[0]
		}
		p.answers--
		if c := p.c; !c.dead && !p.ended {
			if len(c.out) == 0 {
				l.dirty = append(l.dirty, &c.stream)
			}
			switch {
			case c.binary:
				c.out = protocol.AppendBinaryResponse(c.out, &p.req, resp)
			case p.req.Op.IsRetrieval():
				part := p.req // the answer is for the key of its place (moxi asks with get, not getk)
				i := len(part.Keys) - p.answers - 1
				part.Keys = part.Keys[i : i+1]
				c.out, p.ended = protocol.AppendTextRetrievalPart(c.out, &part, cd.resp[:], p.answers == 0)
			case p.req.Op.IsMeta() && protocol.MetaSuppressed(&p.req, resp):
			default:
				c.out = protocol.AppendTextResponse(c.out, &p.req, cd.resp[:])
			}
		}
		if p.answers == 0 {
			b.pend = b.pend[1:]
			p.c = nil
			cd.free = append(cd.free, p)
		}
	}
	b.in = b.in[used:]
	if len(b.in) == 0 {
		b.in = b.in[:0:cap(b.in)]
	}
	if len(b.pend) == 0 {
		b.pend = b.pend[:0:cap(b.pend)]
	}
}
