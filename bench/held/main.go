// Command held measures what idle client connections cost a memcached-speaking server:
// it opens -conns connections, each sends one get and reads its answer, and keeps them all
// open; after -settle it reads the server's resident memory (and, for moxi, its live heap
// and goroutines from the admin port), then has every connection speak again and checks
// each is answered. Around the hold, a probe connection's get latency (p50/p99) shows what
// the held connections cost everyone else.
//
//	held -addr 127.0.0.1:11211 -pid 1234 -conns 10000 [-admin 127.0.0.1:9100]
//
// Each source address (-sources, loopback) gives about 28,000 connections: more need more
// addresses, and a descriptor limit above -conns in this process and the server.
package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	addr := flag.String("addr", "", "server address")
	pid := flag.Int("pid", 0, "the server's process id, for its resident memory")
	conns := flag.Int("conns", 10000, "connections to hold")
	settle := flag.Duration("settle", 10*time.Second, "time the connections stay idle before the memory is read")
	admin := flag.String("admin", "", "moxi's admin address (with --pprof): live heap and goroutines")
	sources := flag.String("sources", "127.0.0.1", "comma-separated local addresses to connect from")
	probes := flag.Int("probes", 5000, "gets of the probe connection before and after the hold")
	useTLS := flag.Bool("tls", false, "connect with TLS (the server's certificate is not verified)")
	flag.Parse()
	if *useTLS {
		wrap = func(c net.Conn) net.Conn { return tls.Client(c, &tls.Config{InsecureSkipVerify: true}) }
	}
	raiseFileLimit()

	probeBefore := probe(*addr, *probes)
	rss0, heap0, gor0 := rss(*pid), liveHeap(*admin), goroutines(*admin)

	held := make([]net.Conn, *conns)
	srcs := strings.Split(*sources, ",")
	var wg sync.WaitGroup
	var failMu sync.Mutex
	failures := 0
	next := make(chan int)
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				local := &net.TCPAddr{IP: net.ParseIP(srcs[i%len(srcs)])}
				d := net.Dialer{LocalAddr: local, Timeout: 10 * time.Second}
				c, err := d.Dial("tcp", *addr)
				if err == nil {
					c = wrap(c)
					err = getOnce(c, i)
				}
				if err != nil {
					failMu.Lock()
					if failures++; failures <= 3 {
						log.Printf("connection %d: %v", i, err)
					}
					failMu.Unlock()
					if c != nil {
						c.Close()
					}
					continue
				}
				held[i] = c
			}
		}()
	}
	for i := range held {
		next <- i
	}
	close(next)
	wg.Wait()
	time.Sleep(*settle)
	rss1, heap1, gor1 := rss(*pid), liveHeap(*admin), goroutines(*admin)
	probeHeld := probe(*addr, *probes)

	// Every held connection speaks again.
	answered := 0
	for i, c := range held {
		if c == nil {
			continue
		}
		if err := getOnce(c, i); err == nil {
			answered++
		} else if answered+failures < 3 {
			log.Printf("held connection %d: %v", i, err)
		}
		c.Close()
	}
	n := float64(*conns - failures)
	fmt.Printf("conns %d failed %d answered_again %d rss_kb_per_conn %.2f", *conns, failures, answered, float64(rss1-rss0)/1024/n)
	if *admin != "" {
		fmt.Printf(" heap_kb_per_conn %.2f goroutines %d→%d", float64(heap1-heap0)/1024/n, gor0, gor1)
	}
	fmt.Printf(" probe_p99_us %.0f→%.0f probe_p50_us %.0f→%.0f\n", probeBefore[1], probeHeld[1], probeBefore[0], probeHeld[0])
}

// wrap makes a connection TLS with -tls.
var wrap = func(c net.Conn) net.Conn { return c }

// getOnce sends one get of a key named for i and reads its (miss) answer.
func getOnce(c net.Conn, i int) error {
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := fmt.Fprintf(c, "get held:%d\r\n", i); err != nil {
		return err
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != "END\r\n" {
		return fmt.Errorf("answered %q", buf)
	}
	return nil
}

// probe times n gets, one at a time, on a connection of its own: p50 and p99 in µs.
func probe(addr string, n int) [2]float64 {
	if n <= 0 {
		return [2]float64{}
	}
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		log.Fatal(err)
	}
	c := wrap(nc)
	defer c.Close()
	r := bufio.NewReader(c)
	lat := make([]float64, 0, n)
	for i := 0; i < n; i++ {
		start := time.Now()
		if _, err := fmt.Fprintf(c, "get probe:%d\r\n", i); err != nil {
			log.Fatal(err)
		}
		line, err := r.ReadSlice('\n')
		if err != nil || !bytes.Equal(line, []byte("END\r\n")) {
			log.Fatalf("probe: %q %v", line, err)
		}
		lat = append(lat, float64(time.Since(start).Microseconds()))
	}
	sort.Float64s(lat)
	return [2]float64{lat[n/2], lat[n*99/100]}
}

// rss is pid's resident memory in bytes.
func rss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		log.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	log.Fatalf("no VmRSS for %d", pid)
	return 0
}

// liveHeap is moxi's heap after a collection (the heap profile's gc=1 runs one first).
func liveHeap(admin string) int64 {
	if admin == "" {
		return 0
	}
	if _, err := fetch(admin, "/debug/pprof/heap?gc=1"); err != nil {
		log.Fatal(err)
	}
	return metric(admin, "go_memstats_heap_alloc_bytes")
}

func goroutines(admin string) int64 {
	if admin == "" {
		return 0
	}
	return metric(admin, "go_goroutines")
}

func metric(admin, name string) int64 {
	body, err := fetch(admin, "/metrics")
	if err != nil {
		log.Fatal(err)
	}
	for _, line := range strings.Split(body, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == name {
			v, _ := strconv.ParseFloat(f[1], 64)
			return int64(v)
		}
	}
	log.Fatalf("no %s in /metrics", name)
	return 0
}

func fetch(admin, path string) (string, error) {
	resp, err := http.Get("http://" + admin + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// raiseFileLimit lifts this process's descriptor limit to its hard limit.
func raiseFileLimit() {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err == nil {
		l.Cur = l.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
}
