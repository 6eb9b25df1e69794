// Package peers keeps the hot caches of a tier's moxi processes fresh: it sends the other
// moxi (hot_cache.peers, or peers_discover) the keys written through this one, batched as
// POST /invalidate, and reads such a batch (JSON lines) for the admin server.
package peers

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
)

// Line is one line of POST /invalidate: a key of a pool to drop as a local write would, or
// FlushAll (a flush_all through the sender: every hot cache empties).
type Line struct {
	Pool     string `json:"pool,omitempty"`
	KeyB64   string `json:"key_b64,omitempty"`
	FlushAll bool   `json:"flush_all,omitempty"`
}

// MaxKey bounds a key in a line: the binary protocol's longest key.
const MaxKey = 1<<16 - 1

// AppendKey appends the line that invalidates key of pool to dst.
func AppendKey(dst []byte, pool string, key []byte) []byte {
	dst = append(dst, `{"pool":`...)
	q, _ := json.Marshal(pool) // a string always marshals
	dst = append(dst, q...)
	dst = append(dst, `,"key_b64":"`...)
	dst = base64.StdEncoding.AppendEncode(dst, key)
	return append(dst, "\"}\n"...)
}

// AppendFlushAll appends the line that empties a hot cache to dst.
func AppendFlushAll(dst []byte) []byte { return append(dst, `{"flush_all":true}`+"\n"...) }

// ParseLines calls key for each key line of body and flushAll for each flush line, in order,
// after checking every line: a body with a malformed line invalidates nothing (the sender
// counts it failed). Blank lines are skipped.
func ParseLines(body []byte, key func(pool string, key []byte), flushAll func()) error {
	type parsed struct {
		pool  string
		key   []byte
		flush bool
	}
	var all []parsed
	for n := 1; len(body) > 0; n++ {
		line, rest, _ := bytes.Cut(body, []byte("\n"))
		body = rest
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var l Line
		if err := json.Unmarshal(line, &l); err != nil {
			return fmt.Errorf("line %d: %w", n, err)
		}
		switch {
		case l.FlushAll && (l.Pool != "" || l.KeyB64 != ""):
			return fmt.Errorf("line %d: flush_all with a key", n)
		case l.FlushAll:
			all = append(all, parsed{flush: true})
			continue
		case l.Pool == "" || l.KeyB64 == "":
			return fmt.Errorf("line %d: needs pool and key_b64", n)
		}
		k, err := base64.StdEncoding.DecodeString(l.KeyB64)
		switch {
		case err != nil:
			return fmt.Errorf("line %d: key_b64: %w", n, err)
		case len(k) == 0 || len(k) > MaxKey:
			return fmt.Errorf("line %d: a key of %d bytes", n, len(k))
		}
		all = append(all, parsed{pool: l.Pool, key: k})
	}
	if len(all) == 0 {
		return errors.New("no line")
	}
	for _, p := range all {
		if p.flush {
			flushAll()
		} else {
			key(p.pool, p.key)
		}
	}
	return nil
}
