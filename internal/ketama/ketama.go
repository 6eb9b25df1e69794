// Package ketama is twemproxy's ketama consistent-hash ring: given the same server names
// and weights it places every 32-bit key hash on the same server as nutcracker 0.5.0.
package ketama

import (
	"cmp"
	"crypto/md5"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

const (
	// pointsPerServer is twemproxy's KETAMA_POINTS_PER_SERVER: the points an average
	// server gets, 4 per MD5 digest.
	pointsPerServer = 160
	pointsPerHash   = 4
	// maxHostLen is the longest "NAME-i" string twemproxy hashes; its snprintf into a
	// 273-byte buffer silently cuts longer ones.
	maxHostLen = 272
	// defaultPort is the port libmemcached and twemproxy leave out of a server's name.
	defaultPort = 11211
)

// Node is one server on the ring.
//
// Name is the server's ring identity, the string whose MD5 digests become its points.
// twemproxy uses the name given in "host:port:weight name" when there is one; otherwise,
// for compatibility with libmemcached, "host" when the port is 11211 and "host:port" for
// any other port (see ServerName). Two pools with the same names and weights place keys
// identically whatever the addresses, which is what lets a server be replaced or moved
// without moving keys. Weight must be positive.
type Node struct {
	Name   string
	Weight int
}

// ServerName is the ring name twemproxy and libmemcached give a server at addr
// ("host:port") that has no name of its own: "host" when the port is 11211, "host:port"
// otherwise. moxi has no other copy of this rule: a server's default name must be the
// same wherever it is computed, or two parts of moxi would disagree about a key's server.
//
// The port is the text after the last colon, as twemproxy reads "host:port:weight". An
// IPv6 host loses its brackets: "[::1]:11211" gives "::1" and "[::1]:11212" gives
// "::1:11212". twemproxy reaches an IPv6 server only when it is written without brackets
// ("::1:11212:1"; with brackets getaddrinfo fails), and libmemcached keeps the bare host,
// so these are the names their rings use for the same server.
func ServerName(addr string) string {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return addr
	}
	host, port := addr[:i], addr[i+1:]
	if len(host) >= 2 && host[0] == '[' && host[len(host)-1] == ']' {
		host = host[1 : len(host)-1]
	}
	if p, err := strconv.Atoi(port); err == nil && p == defaultPort {
		return host
	}
	return host + ":" + port
}

// Ring is an immutable ketama continuum. It is safe for concurrent use; build a new one
// when the servers change.
type Ring struct {
	// values are the sorted points; owners[i] is the index of the node owning values[i].
	values []uint32
	owners []int32
}

// New builds the ring twemproxy builds for nodes, all of them live. Node i gets
// 4 × floor(weight/total × 40 × len(nodes)) points, computed in float32 as twemproxy
// does (so a very light node may get none): the MD5 digests of "NAME-0", "NAME-1", …,
// each read as four little-endian 32-bit points. New panics if a weight is not positive;
// configuration loading rejects those first.
func New(nodes []Node) *Ring {
	var total uint32
	for _, n := range nodes {
		if n.Weight <= 0 {
			panic(fmt.Sprintf("ketama: node %q has weight %d", n.Name, n.Weight))
		}
		total += uint32(n.Weight)
	}
	type point struct {
		value uint32
		owner int32
	}
	// twemproxy sorts its servers by name when it loads the config, and a stable sort
	// of the points keeps equal points in that order.
	rank := make([]int32, len(nodes))
	for r, i := range Order(nodes) {
		rank[i] = int32(r)
	}
	points := make([]point, 0, len(nodes)*pointsPerServer)
	var buf []byte
	for i, n := range nodes {
		for h := range numPoints(n.Weight, total, len(nodes)) / pointsPerHash {
			buf = strconv.AppendUint(append(append(buf[:0], n.Name...), '-'), uint64(h), 10)
			if len(buf) > maxHostLen {
				buf = buf[:maxHostLen]
			}
			sum := md5.Sum(buf)
			for x := range pointsPerHash {
				points = append(points, point{binary.LittleEndian.Uint32(sum[4*x:]), int32(i)})
			}
		}
	}
	// twemproxy sorts with glibc's qsort, a merge sort that keeps equal points in insertion
	// order, its server order; breaking ties by rank gives the same continuum.
	slices.SortFunc(points, func(a, b point) int {
		return cmp.Or(cmp.Compare(a.value, b.value), cmp.Compare(rank[a.owner], rank[b.owner]))
	})
	r := &Ring{values: make([]uint32, len(points)), owners: make([]int32, len(points))}
	for i, p := range points {
		r.values[i], r.owners[i] = p.value, p.owner
	}
	return r
}

// Order returns the indices of nodes in the order twemproxy keeps its servers: it sorts
// them by name when it loads its config, shorter names first and equal lengths bytewise.
// That order, not the config's, lays out a modula continuum and breaks ties between equal
// ketama points.
func Order(nodes []Node) []int {
	order := make([]int, len(nodes))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		x, y := nodes[a].Name, nodes[b].Name
		return cmp.Or(cmp.Compare(len(x), len(y)), strings.Compare(x, y))
	})
	return order
}

// numPoints is twemproxy's points-per-server arithmetic, kept in float32 step by step
// (the explicit conversions stop the compiler from fusing operations) because the
// rounding decides whether weights such as 1,2,3 give 20 or 19 digests.
func numPoints(weight int, total uint32, nodes int) int {
	pct := float32(weight) / float32(total)
	v := float32(pct * pointsPerServer)
	v = float32(v / pointsPerHash)
	v = float32(v * float32(nodes))
	// The C adds a double epsilon and converts back to float, which only matters at 0.
	v = float32(float64(v) + 0.0000000001)
	return int(math.Floor(float64(v))) * pointsPerHash
}

// Points are the ring's points, sorted: a key's owner is that of the first point at or
// after its hash (wrapping), so ownership changes only at them. The slice is the ring's:
// do not change it.
func (r *Ring) Points() []uint32 { return r.values }

// Pick returns the index (into the nodes given to New) of the node owning hash: the owner
// of the first point at or after hash, wrapping to the first point. It returns -1 for a
// ring without points. It does not allocate.
func (r *Ring) Pick(hash uint32) int {
	if len(r.values) == 0 {
		return -1
	}
	return int(r.owners[r.search(hash)])
}

// PickLive is Pick for failover: it walks the ring from hash's point and returns the first
// owner for which alive reports true, so a dead node's keys spread over the next live
// nodes on the ring and the keys of live nodes do not move. It returns -1 when no node is
// alive. alive is called at most once per point and is not retained.
//
// twemproxy's auto_eject_hosts instead rebuilds the ring without the dead node, which
// moves some keys between live nodes as well; moxi prefers keeping them still.
func (r *Ring) PickLive(hash uint32, alive func(node int) bool) int {
	n := len(r.values)
	start := 0
	if n > 0 {
		start = r.search(hash)
	}
	last := -1
	for i := range n {
		o := int(r.owners[(start+i)%n])
		if o == last {
			continue
		}
		if alive(o) {
			return o
		}
		last = o
	}
	return -1
}

// search returns the index of the first point ≥ hash, or 0 when hash is past the last.
func (r *Ring) search(hash uint32) int {
	lo, hi := 0, len(r.values)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if r.values[m] < hash {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == len(r.values) {
		return 0
	}
	return lo
}
