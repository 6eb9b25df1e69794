package discover

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"strconv"
)

// ClusterConfig is a configuration endpoint's answer to "config get cluster" (ElastiCache's
// and Memorystore's memcached clusters): the cluster's nodes, numbered by a version that
// grows with every change, so that an older answer is told apart.
type ClusterConfig struct {
	Version int64
	Nodes   []ClusterNode
}

// ClusterNode is one node of a ClusterConfig: Host is its stable name (the ring name), IP
// the address to dial.
type ClusterNode struct {
	Host, IP string
	Port     int
}

// maxClusterNodes bounds the nodes one answer may list: far above any cluster (ElastiCache
// allows 60 nodes), far below what would cost memory.
const maxClusterNodes = 4096

var (
	clusterHeader = []byte("CONFIG cluster 0 ")
	clusterEnd    = []byte("END\r\n")
)

// ParseClusterConfig reads a whole answer to "config get cluster":
//
//	CONFIG cluster 0 <length>\r\n
//	<version>\n
//	<host>|<ip>|<port> <host>|<ip>|<port> ...\n
//	\r\n
//	END\r\n
//
// <length> must be a number, but is not held to the bytes that follow: the answers
// documented for ElastiCache do not match their own lengths, and the clients made for it
// read the lines instead. Any other form, a port out of range, a node listed twice or more
// than maxClusterNodes nodes is an error.
func ParseClusterConfig(data []byte) (ClusterConfig, error) {
	var c ClusterConfig
	rest, ok := bytes.CutPrefix(data, clusterHeader)
	if !ok {
		return c, fmt.Errorf("want %q, got %q", clusterHeader, head(data))
	}
	lenText, rest, ok := bytes.Cut(rest, []byte("\r\n"))
	if n, err := strconv.Atoi(string(lenText)); !ok || err != nil || n < 0 {
		return c, fmt.Errorf("bad length %q in the CONFIG line", head(lenText))
	}
	body, ok := bytes.CutSuffix(rest, append([]byte("\r\n"), clusterEnd...))
	if !ok {
		return c, fmt.Errorf("want \\r\\nEND\\r\\n after the config, got %q", head(rest[max(0, len(rest)-64):]))
	}
	var err error
	version, nodes, ok := bytes.Cut(body, []byte("\n"))
	if !ok {
		return c, errors.New("no version line")
	}
	if c.Version, err = strconv.ParseInt(string(version), 10, 64); err != nil || c.Version < 0 {
		return c, fmt.Errorf("bad version %q", head(version))
	}
	nodes, ok = bytes.CutSuffix(nodes, []byte("\n"))
	if !ok {
		return c, errors.New("the nodes line does not end with \\n")
	}
	seen := map[string]bool{}
	for _, f := range bytes.Fields(nodes) {
		if len(c.Nodes) == maxClusterNodes {
			return c, fmt.Errorf("more than %d nodes", maxClusterNodes)
		}
		parts := bytes.Split(f, []byte("|"))
		if len(parts) != 3 {
			return c, fmt.Errorf("node %q: want host|ip|port", head(f))
		}
		port, err := strconv.Atoi(string(parts[2]))
		host, ip := string(parts[0]), string(parts[1])
		if err != nil || port < 1 || port > 65535 || host == "" || net.ParseIP(ip) == nil {
			return c, fmt.Errorf("node %q: want a host name, an IP address and a port from 1 to 65535", head(f))
		}
		if seen[host] {
			return c, fmt.Errorf("node %s listed twice", host)
		}
		seen[host] = true
		c.Nodes = append(c.Nodes, ClusterNode{Host: host, IP: ip, Port: port})
	}
	return c, nil
}

// AppendClusterConfig appends c as a configuration endpoint answers it: what
// ParseClusterConfig reads back.
func AppendClusterConfig(dst []byte, c ClusterConfig) []byte {
	body := strconv.AppendInt(nil, c.Version, 10)
	body = append(body, '\n')
	for i, n := range c.Nodes {
		if i > 0 {
			body = append(body, ' ')
		}
		body = fmt.Appendf(body, "%s|%s|%d", n.Host, n.IP, n.Port)
	}
	body = append(body, '\n')
	dst = append(dst, clusterHeader...)
	dst = strconv.AppendInt(dst, int64(len(body)), 10)
	dst = append(dst, "\r\n"...)
	dst = append(dst, body...)
	dst = append(dst, "\r\n"...)
	return append(dst, clusterEnd...)
}

// head is at most the first 64 bytes of b, for messages.
func head(b []byte) []byte { return b[:min(len(b), 64)] }
