package discover

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/moxi-proxy/moxi/internal/config"
)

// maxClusterAnswer bounds the bytes read of one answer to "config get cluster": far more
// than maxClusterNodes nodes take.
const maxClusterAnswer = 1 << 20

// AskClusterConfig asks the configuration endpoint at addr for the cluster's nodes, once,
// within ctx: "config get cluster" on a connection of its own.
func AskClusterConfig(ctx context.Context, addr string) (ClusterConfig, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return ClusterConfig{}, err
	}
	defer c.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(deadline)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := c.Write([]byte("config get cluster\r\n")); err != nil {
		return ClusterConfig{}, err
	}
	// The answer ends with its END line; lines are read until then, within the bound.
	r := bufio.NewReader(c)
	var answer []byte
	for !bytes.HasSuffix(answer, clusterEnd) {
		line, err := r.ReadSlice('\n')
		if len(answer) == 0 && (bytes.HasPrefix(line, []byte("ERROR")) || bytes.HasPrefix(line, []byte("CLIENT_ERROR")) || bytes.HasPrefix(line, []byte("SERVER_ERROR"))) {
			return ClusterConfig{}, fmt.Errorf("%s is no configuration endpoint: it answered %q", addr, bytes.TrimSpace(line))
		}
		if len(answer)+len(line) > maxClusterAnswer {
			return ClusterConfig{}, fmt.Errorf("answer of %s over %d bytes", addr, maxClusterAnswer)
		}
		answer = append(answer, line...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			return ClusterConfig{}, fmt.Errorf("answer of %s: %w", addr, err)
		}
	}
	return ParseClusterConfig(answer)
}

// clusterServers are a cluster's nodes as servers: named by host name on the ring, dialed
// at their IP address.
func clusterServers(c ClusterConfig) ([]config.Server, error) {
	var out []config.Server
	for _, n := range c.Nodes {
		out = append(out, config.Server{Name: n.Host, Addr: net.JoinHostPort(n.IP, strconv.Itoa(n.Port)), Weight: 1})
	}
	return nonEmpty(out, "config get cluster")
}
