// Command fanout is the floor of a replicated write: the least a proxy can do to store a
// text set on N memcached servers. Each client connection gets a goroutine and one
// connection of its own to each server; a set (its line and data block, nothing parsed but
// the length) is written to the N servers that follow its key's hash, and answered with the
// first server's answer once quorum of them have answered (the rest are read before the
// next request). No routing table, no pipelining, no limits, no features: what a real proxy
// does on top of this is its own cost. With -replicas 1 it is a plain relay of sets.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"hash/fnv"
	"io"
	"log"
	"net"
	"strconv"
	"strings"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve clients on")
	servers := flag.String("servers", "", "comma-separated memcached addresses")
	replicas := flag.Int("replicas", 2, "servers each set is written to")
	quorum := flag.Int("quorum", 0, "answers a set waits for (0: all of them)")
	flag.Parse()
	addrs := strings.Split(*servers, ",")
	if *quorum <= 0 || *quorum > *replicas {
		*quorum = *replicas
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go serve(c, addrs, *replicas, *quorum)
	}
}

// serve relays one client's sets.
func serve(c net.Conn, addrs []string, replicas, quorum int) {
	defer c.Close()
	backends := make([]net.Conn, len(addrs))
	readers := make([]*bufio.Reader, len(addrs))
	for i, a := range addrs {
		b, err := net.Dial("tcp", a)
		if err != nil {
			log.Print(err)
			return
		}
		defer b.Close()
		backends[i], readers[i] = b, bufio.NewReader(b)
	}
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return
		}
		f := bytes.Fields(line)
		if len(f) < 5 || string(f[0]) != "set" {
			if _, err := c.Write([]byte("ERROR\r\n")); err != nil {
				return
			}
			continue
		}
		n, _ := strconv.Atoi(string(f[4]))
		req := append([]byte(nil), line...)
		start := len(req)
		req = append(req, make([]byte, n+2)...)
		if _, err := io.ReadFull(r, req[start:]); err != nil {
			return
		}
		h := fnv.New32a()
		h.Write(f[1])
		first := int(h.Sum32() % uint32(len(addrs)))
		// Written to every server first, then their answers read in order: no goroutine
		// and no wake-up but the answers' own.
		for k := range replicas {
			if _, err := backends[(first+k)%len(addrs)].Write(req); err != nil {
				return
			}
		}
		var reply []byte
		for k := range replicas {
			ans, err := readers[(first+k)%len(addrs)].ReadSlice('\n')
			if err != nil {
				return
			}
			if k == 0 {
				reply = append(reply[:0], ans...)
			}
			if k+1 == quorum {
				if _, err := c.Write(reply); err != nil {
					return
				}
			}
		}
	}
}
