// Package placement reads and writes the placement vectors recorded from a live nutcracker
// (internal/ketama/testdata/twemproxy_placement.txt): a list of keys, and for each pool
// configuration the server twemproxy put each key on. The ketama package checks its
// placement against them, and twemproxyconf the pools it converts.
//
// The format, line by line: `# comment`, `key "quoted"` for each key, then for each pool
// `pool DIST HASH SPEC|SPEC|…` followed by `owners DIGITS`, a digit per key.
package placement

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Pool is one recorded pool configuration.
type Pool struct {
	Dist, Hash string   // twemproxy's distribution and hash names
	Servers    []string // twemproxy server specs: "host:port:weight [name]"
	Owners     []int    // Owners[i] is the index in Servers of the server of key i
}

// Read reads the file at path: its keys and pools, each pool with an owner per key.
func Read(path string) (keys []string, pools []Pool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		kind, rest, _ := strings.Cut(sc.Text(), " ")
		switch kind {
		case "#":
		case "key":
			k, err := strconv.Unquote(rest)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: bad key line %q", path, sc.Text())
			}
			keys = append(keys, k)
		case "pool":
			f := strings.SplitN(rest, " ", 3)
			if len(f) != 3 {
				return nil, nil, fmt.Errorf("%s: bad pool line %q", path, sc.Text())
			}
			pools = append(pools, Pool{Dist: f[0], Hash: f[1], Servers: strings.Split(f[2], "|")})
		case "owners":
			if len(pools) == 0 || len(rest) != len(keys) {
				return nil, nil, fmt.Errorf("%s: owners line without pool or with %d owners for %d keys", path, len(rest), len(keys))
			}
			p := &pools[len(pools)-1]
			for _, c := range rest {
				p.Owners = append(p.Owners, int(c-'0'))
			}
		default:
			return nil, nil, fmt.Errorf("%s: bad line %q", path, sc.Text())
		}
	}
	if err := sc.Err(); err != nil {
		return nil, nil, err
	}
	if len(keys) == 0 || len(pools) == 0 {
		return nil, nil, fmt.Errorf("%s: %d keys, %d pools", path, len(keys), len(pools))
	}
	return keys, pools, nil
}

// Write writes comment (a line), keys and pools in the format Read reads.
func Write(w io.Writer, comment string, keys []string, pools []Pool) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "# %s\n", comment)
	for _, k := range keys {
		fmt.Fprintf(bw, "key %q\n", k)
	}
	for _, p := range pools {
		fmt.Fprintf(bw, "pool %s %s %s\nowners ", p.Dist, p.Hash, strings.Join(p.Servers, "|"))
		for _, o := range p.Owners {
			bw.WriteString(strconv.Itoa(o))
		}
		bw.WriteString("\n")
	}
	return bw.Flush()
}
