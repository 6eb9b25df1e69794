package migrate

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"strconv"

	"github.com/moxi-proxy/moxi/internal/itemcopy"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// The old server is read with memcached's meta protocol (text), which, unlike the binary
// protocol, tells an item's remaining TTL: a copy keeps it. The requests and the items are
// package itemcopy's, encoded and read by protocol's meta codec.

// errMeta is an answer the old server should not have given.
var errMeta = errors.New("unexpected meta answer")

// readItem reads the answer to itemcopy.Get, the value bounded by lim.
func readItem(r *bufio.Reader, lim protocol.Limits) (itemcopy.Item, error) {
	var resp protocol.Response
	if err := protocol.ReadMetaAnswer(r, lim, &resp); err != nil {
		return itemcopy.Item{}, err
	}
	if c := resp.Meta.Code; c != protocol.MetaVA && c != protocol.MetaEN {
		return itemcopy.Item{}, fmt.Errorf("%w to mg: %s", errMeta, answerText(&resp))
	}
	return itemcopy.Parse(&resp), nil
}

// readDeleted reads the answer to itemcopy.Delete: whether the key was there.
func readDeleted(r *bufio.Reader, lim protocol.Limits) (bool, error) {
	var resp protocol.Response
	if err := protocol.ReadMetaAnswer(r, lim, &resp); err != nil {
		return false, err
	}
	if c := resp.Meta.Code; c != protocol.MetaHD && c != protocol.MetaNF {
		return false, fmt.Errorf("%w to md: %s", errMeta, answerText(&resp))
	}
	return resp.Meta.Code == protocol.MetaHD, nil
}

// answerText is resp as the server wrote it, for an error.
func answerText(resp *protocol.Response) string {
	return strconv.Quote(string(protocol.AppendTextResponse(nil, &protocol.Request{Op: protocol.OpMetaGet}, []protocol.Response{*resp})))
}

// readLine reads one line without its CRLF or LF, bounded by the reader's buffer.
func readLine(r *bufio.Reader) ([]byte, error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return nil, err
	}
	return bytes.TrimRight(line, "\r\n"), nil
}

// DumpEntry is one line of "lru_crawler metadump" (hash or all).
type DumpEntry struct {
	Key []byte
	Exp int64 // absolute unix time of expiry; -1 = never
}

// ParseMetadumpLine parses "key=<url-encoded> exp=<unix|-1> la=… cas=… …". ok is false for
// a line that is not an item (memcached's END, or garbage).
func ParseMetadumpLine(line []byte) (DumpEntry, bool) {
	var e DumpEntry
	var haveKey, haveExp bool
	// Fields one by one, without allocating them: a copy lists a server's every key.
	for rest := line; len(rest) > 0 && !(haveKey && haveExp); {
		var f []byte
		if i := bytes.IndexByte(rest, ' '); i >= 0 {
			f, rest = rest[:i], rest[i+1:]
		} else {
			f, rest = bytes.TrimRight(rest, "\r\n"), nil
		}
		switch {
		case bytes.HasPrefix(f, []byte("key=")):
			value := f[len("key="):]
			if bytes.IndexByte(value, '%') < 0 {
				e.Key = bytes.Clone(value)
			} else {
				k, err := url.PathUnescape(string(value))
				if err != nil {
					return DumpEntry{}, false
				}
				e.Key = []byte(k)
			}
			if len(e.Key) == 0 || len(e.Key) > 250 {
				return DumpEntry{}, false
			}
			haveKey = true
		case bytes.HasPrefix(f, []byte("exp=")):
			v, err := strconv.ParseInt(string(f[len("exp="):]), 10, 64)
			if err != nil {
				return DumpEntry{}, false
			}
			e.Exp, haveExp = v, true
		}
	}
	return e, haveKey && haveExp
}
