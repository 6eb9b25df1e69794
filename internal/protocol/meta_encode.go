package protocol

import (
	"bytes"
	"encoding/base64"
	"strconv"
)

// appendMetaResponse appends the answer to a meta request as memcached writes it: the code
// (VA with the value's length), the return flags, and for VA the value; nothing when the q
// flag suppresses it; an error line for an error status.
func appendMetaResponse(dst []byte, req *Request, resps []Response) []byte {
	if req.Op == OpMetaNoop {
		return append(dst, "MN\r\n"...)
	}
	if len(resps) == 0 {
		return appendTextLine(dst, "SERVER_ERROR ", textMsgNoAnswer)
	}
	r := &resps[0]
	code := metaCodeOf(req, r)
	if code == MetaNone {
		return appendTextStatus(dst, r)
	}
	if MetaSuppressed(req, r) {
		return dst
	}
	dst = append(dst, code.String()...)
	if code == MetaVA {
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, uint64(len(r.Value)), 10)
	}
	if req.Namespace > 0 {
		dst = appendClientFlags(dst, req, code, r.Meta.Flags)
	} else {
		dst = append(dst, r.Meta.Flags...)
	}
	dst = append(dst, textCRLF...)
	if code == MetaVA {
		dst = append(dst, r.Value...)
		dst = append(dst, textCRLF...)
	}
	return dst
}

// appendClientFlags appends flags, a server's return flags to req, with the key they carry
// (k's, or the first token of an ME answer) as req's client named it: without req's
// namespace, and in base64 again when req has b.
func appendClientFlags(dst []byte, req *Request, code MetaCode, flags []byte) []byte {
	for i, tok := range bytes.Split(flags, []byte{' '}) {
		if i > 0 {
			dst = append(dst, ' ')
		}
		switch {
		case code == MetaME && i == 1:
			dst = appendClientKeyToken(dst, req, tok)
		case code != MetaME && len(tok) > 0 && tok[0] == 'k':
			dst = append(dst, 'k')
			dst = appendClientKeyToken(dst, req, tok[1:])
		default:
			dst = append(dst, tok...)
		}
	}
	return dst
}

// appendClientKeyToken appends tok, a key as the server returned it (base64 when req has
// b, mostly: see below), without req's namespace.
func appendClientKeyToken(dst []byte, req *Request, tok []byte) []byte {
	if !req.Meta.Base64 {
		return append(dst, req.ClientKey(tok)...)
	}
	key, err := base64.StdEncoding.AppendDecode(nil, tok)
	if err != nil {
		// memcached 1.6.18 returns a hit's key decoded, without b; a namespaced key
		// (with its colon) is never valid base64.
		return append(dst, req.ClientKey(tok)...)
	}
	return base64.StdEncoding.AppendEncode(dst, req.ClientKey(key))
}

// metaCodeOf is the code of r's answer line, or MetaNone for an error line. A Response
// filled without Meta (by a server that answered in another protocol) gets the code its
// Status means for req's command.
func metaCodeOf(req *Request, r *Response) MetaCode {
	if r.Meta.Code != MetaNone {
		return r.Meta.Code
	}
	switch r.Status {
	case StatusOK:
		if req.Meta.ReturnValue && req.Op != OpMetaSet && req.Op != OpMetaDelete {
			return MetaVA
		}
		return MetaHD
	case StatusNotFound:
		if req.Op == OpMetaGet {
			return MetaEN
		}
		return MetaNF
	case StatusNotStored:
		return MetaNS
	case StatusExists:
		return MetaEX
	}
	return MetaNone
}

// AppendMetaRequest appends req, a decoded meta request, as it is sent on to a memcached:
// the key token and every flag as the client sent them, in the same order, but without q,
// so that every request is answered and the answers can be matched to the requests (the
// proxy then drops what q suppresses, see MetaSuppressed). ms carries its data block.
//
// One request keeps its q: an ma with q and N, whose answer memcached writes when N created
// the item and drops when the item was there, which the answer itself does not tell. It is
// sent with q and followed by an mn, and ReadMetaAnswerFor reads what comes back.
func AppendMetaRequest(dst []byte, req *Request) []byte {
	if MetaThroughMN(req) {
		dst = appendMetaRequest(dst, req, true)
		return append(dst, "mn\r\n"...)
	}
	return appendMetaRequest(dst, req, false)
}

// MetaThroughMN reports whether AppendMetaRequest sends req on with its q and an mn after
// it (an ma with q and N), so that its answer is read up to that MN (ReadMetaAnswerFor).
func MetaThroughMN(req *Request) bool {
	return req.Op == OpMetaArithmetic && req.Meta.Quiet && req.Meta.Vivify
}

// appendMetaRequest appends req as sent, q included when quiet.
func appendMetaRequest(dst []byte, req *Request, quiet bool) []byte {
	dst = append(dst, req.Op.String()...)
	if req.Op == OpMetaNoop {
		return append(dst, textCRLF...)
	}
	dst = append(dst, ' ')
	dst = append(dst, req.Meta.KeyToken...)
	if req.Op == OpMetaSet {
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, uint64(len(req.Value)), 10)
	}
	for _, f := range req.Meta.Flags {
		if f.Letter == 'q' && !quiet {
			continue
		}
		dst = append(dst, ' ', f.Letter)
		dst = append(dst, f.Token...)
	}
	dst = append(dst, textCRLF...)
	if req.Op == OpMetaSet {
		dst = append(dst, req.Value...)
		dst = append(dst, textCRLF...)
	}
	return dst
}
