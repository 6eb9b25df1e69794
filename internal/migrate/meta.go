package migrate

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"strconv"
)

// The old server is read with memcached's meta protocol (text), which, unlike the binary
// protocol, tells an item's remaining TTL: a copy keeps it. Keys travel base64-encoded
// (the b flag), so that any key a binary client could store survives the text protocol.

// Item is a value read from the old server.
type Item struct {
	Found bool
	Value []byte
	Flags uint32
	TTL   int64 // seconds left; -1 = never expires
}

// appendMetaGet appends a meta get of key asking for value, client flags and TTL.
func appendMetaGet(dst, key []byte) []byte {
	dst = append(dst, "mg "...)
	dst = base64.StdEncoding.AppendEncode(dst, key)
	return append(dst, " b t f v\r\n"...)
}

// appendMetaDelete appends a meta delete of key.
func appendMetaDelete(dst, key []byte) []byte {
	dst = append(dst, "md "...)
	dst = base64.StdEncoding.AppendEncode(dst, key)
	return append(dst, " b\r\n"...)
}

// errMeta is an answer the old server should not have given.
var errMeta = errors.New("unexpected meta answer")

// readMetaGet reads the answer to one appendMetaGet, the value bounded by maxValue.
func readMetaGet(r *bufio.Reader, maxValue int) (Item, error) {
	line, err := readLine(r)
	if err != nil {
		return Item{}, err
	}
	if bytes.Equal(line, []byte("EN")) {
		return Item{}, nil
	}
	fields := bytes.Fields(line)
	if len(fields) < 2 || string(fields[0]) != "VA" {
		return Item{}, fmt.Errorf("%w: %q", errMeta, line)
	}
	size, err := strconv.Atoi(string(fields[1]))
	if err != nil || size < 0 || size > maxValue {
		return Item{}, fmt.Errorf("%w: value size in %q", errMeta, line)
	}
	it := Item{Found: true, TTL: -1}
	for _, f := range fields[2:] {
		switch f[0] {
		case 't':
			if it.TTL, err = strconv.ParseInt(string(f[1:]), 10, 64); err != nil {
				return Item{}, fmt.Errorf("%w: ttl in %q", errMeta, line)
			}
		case 'f':
			v, err := strconv.ParseUint(string(f[1:]), 10, 32)
			if err != nil {
				return Item{}, fmt.Errorf("%w: flags in %q", errMeta, line)
			}
			it.Flags = uint32(v)
		}
	}
	it.Value = make([]byte, size+2)
	if _, err := readFull(r, it.Value); err != nil {
		return Item{}, err
	}
	if !bytes.HasSuffix(it.Value, []byte("\r\n")) {
		return Item{}, fmt.Errorf("%w: value not ended by CRLF", errMeta)
	}
	it.Value = it.Value[:size:size]
	return it, nil
}

// readMetaDelete reads the answer to one appendMetaDelete: whether the key was there.
func readMetaDelete(r *bufio.Reader) (bool, error) {
	line, err := readLine(r)
	if err != nil {
		return false, err
	}
	if s := string(line); s != "HD" && s != "NF" {
		return false, fmt.Errorf("%w: %q", errMeta, line)
	}
	return string(line) == "HD", nil
}

// readLine reads one line without its CRLF or LF, bounded by the reader's buffer.
func readLine(r *bufio.Reader) ([]byte, error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return nil, err
	}
	return bytes.TrimRight(line, "\r\n"), nil
}

func readFull(r *bufio.Reader, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := r.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
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
