// Command pipeline times one pipeline of memcached requests on one connection: the time from
// writing all of them in one write to reading the last answer. -addr may name several targets
// (comma-separated): each has its own connection, and the repetitions alternate between them,
// one each in turn, so that a machine that slows down or speeds up during the run weighs on
// every target alike. bench/pipeline.sh runs it once per case and round; it prints the median
// of each target's repetitions in microseconds (space-separated, in -addr's order) and appends
// every repetition to that target's file in -samples (comma-separated too).
//
// Cases, each over -n keys k0 … k<n-1> with 10-byte values:
//
//	set     text: n "set k<i> 0 0 10" → n STORED
//	get     text: n "get k<i>" (set first, untimed) → n VALUE … END
//	binary  binary: n setq (quiet: no answer on success) and one noop → the noop's answer
//	ms      meta: n "ms k<i> 10" → n HD
//	mg      meta: n "mg k<i> v" (set first, untimed) → n VA 10 …
//
// Every answer is compared byte for byte with what memcached sends; a wrong or missing one
// (each read has -timeout) ends the run with exit status 1.
package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

func main() {
	addr := flag.String("addr", "", "memcached (or proxy) `host:port`, or several, comma-separated")
	name := flag.String("case", "set", "set, get, binary, ms or mg")
	n := flag.Int("n", 100, "requests in one pipeline")
	reps := flag.Int("reps", 200, "timed repetitions")
	warmup := flag.Int("warmup", 20, "untimed repetitions first")
	timeout := flag.Duration("timeout", 5*time.Second, "bound on each repetition")
	samples := flag.String("samples", "", "append each repetition's µs to this `file` (one per -addr, comma-separated)")
	flag.Parse()
	var files []string
	if *samples != "" {
		files = strings.Split(*samples, ",")
	}
	if err := run(strings.Split(*addr, ","), *name, *n, *reps, *warmup, *timeout, files); err != nil {
		fmt.Fprintln(os.Stderr, "pipeline:", err)
		os.Exit(1)
	}
}

func run(addrs []string, name string, n, reps, warmup int, timeout time.Duration, samples []string) error {
	if n < 1 || reps < 1 || warmup < 0 {
		return errors.New("-n and -reps must be at least 1, -warmup at least 0")
	}
	if samples != nil && len(samples) != len(addrs) {
		return fmt.Errorf("-samples names %d files for %d addresses", len(samples), len(addrs))
	}
	var req, want []byte
	switch name {
	case "set":
		req, want = textSets(n)
	case "get":
		req, want = textGets(n)
	case "binary":
		req, want = binarySetqNoop(n)
	case "ms":
		req, want = metaSets(n)
	case "mg":
		req, want = metaGets(n)
	default:
		return fmt.Errorf("-case %q is not set, get, binary, ms or mg", name)
	}
	conns := make([]net.Conn, len(addrs))
	for i, addr := range addrs {
		c, err := net.DialTimeout("tcp", addr, timeout)
		if err != nil {
			return fmt.Errorf("dial %s: %w", addr, err)
		}
		defer c.Close()
		conns[i] = c
		if name == "get" || name == "mg" {
			// The keys must hold their values before the gets are timed.
			sets, stored := textSets(n)
			if _, err := roundTrip(c, sets, stored, timeout, false); err != nil {
				return fmt.Errorf("%s: setting the keys: %w", addr, err)
			}
		}
	}
	µs := make([][]float64, len(addrs))
	for i := range warmup + reps {
		for j, c := range conns {
			d, err := roundTrip(c, req, want, timeout, name == "binary")
			if err != nil {
				return fmt.Errorf("%s: %s repetition %d: %w", addrs[j], name, i, err)
			}
			if i >= warmup {
				µs[j] = append(µs[j], float64(d.Nanoseconds())/1e3)
			}
		}
	}
	medians := make([]string, len(addrs))
	for j := range addrs {
		if samples != nil {
			if err := appendSamples(samples[j], µs[j]); err != nil {
				return err
			}
		}
		slices.Sort(µs[j])
		medians[j] = strconv.FormatFloat(median(µs[j]), 'f', 1, 64)
	}
	fmt.Println(strings.Join(medians, " "))
	return nil
}

// roundTrip writes req in one write and reads len(want) bytes; it returns the time between
// the two. Binary answers are compared without their CAS (the last 8 header bytes).
func roundTrip(c net.Conn, req, want []byte, timeout time.Duration, binaryAnswer bool) (time.Duration, error) {
	got := make([]byte, len(want))
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return 0, err
	}
	start := time.Now()
	if _, err := c.Write(req); err != nil {
		return 0, fmt.Errorf("write: %w", err)
	}
	if _, err := io.ReadFull(c, got); err != nil {
		return 0, fmt.Errorf("read %d answer bytes: %w (got %q)", len(want), err, got)
	}
	d := time.Since(start)
	cmp := len(want)
	if binaryAnswer {
		cmp = 16
	}
	if !bytes.Equal(got[:cmp], want[:cmp]) {
		return 0, fmt.Errorf("wrong answer: got %q, want %q", got, want)
	}
	return d, nil
}

func key(i int) string   { return "k" + strconv.Itoa(i) }
func value(i int) string { return fmt.Sprintf("%010d", i) }

func textSets(n int) (req, want []byte) {
	for i := range n {
		req = fmt.Appendf(req, "set %s 0 0 10\r\n%s\r\n", key(i), value(i))
		want = append(want, "STORED\r\n"...)
	}
	return req, want
}

func textGets(n int) (req, want []byte) {
	for i := range n {
		req = fmt.Appendf(req, "get %s\r\n", key(i))
		want = fmt.Appendf(want, "VALUE %s 0 10\r\n%s\r\nEND\r\n", key(i), value(i))
	}
	return req, want
}

func metaSets(n int) (req, want []byte) {
	for i := range n {
		req = fmt.Appendf(req, "ms %s 10\r\n%s\r\n", key(i), value(i))
		want = append(want, "HD\r\n"...)
	}
	return req, want
}

func metaGets(n int) (req, want []byte) {
	for i := range n {
		req = fmt.Appendf(req, "mg %s v\r\n", key(i))
		want = fmt.Appendf(want, "VA 10\r\n%s\r\n", value(i))
	}
	return req, want
}

// binarySetqNoop returns n setq requests and a noop, and the noop's answer: a setq that
// succeeds has none.
func binarySetqNoop(n int) (req, want []byte) {
	const (
		opSetq = 0x11
		opNoop = 0x0a
	)
	extras := make([]byte, 8) // flags 0, expiry 0
	for i := range n {
		req = binaryHeader(req, 0x80, opSetq, len(key(i)), len(extras), len(extras)+len(key(i))+10, uint32(i))
		req = append(req, extras...)
		req = append(req, key(i)...)
		req = append(req, value(i)...)
	}
	req = binaryHeader(req, 0x80, opNoop, 0, 0, 0, uint32(n))
	want = binaryHeader(nil, 0x81, opNoop, 0, 0, 0, uint32(n))
	return req, want
}

// binaryHeader appends a 24-byte binary-protocol header with status (or vbucket) 0 and CAS 0.
func binaryHeader(b []byte, magic, op byte, keyLen, extLen, bodyLen int, opaque uint32) []byte {
	b = append(b, magic, op)
	b = binary.BigEndian.AppendUint16(b, uint16(keyLen))
	b = append(b, byte(extLen), 0, 0, 0)
	b = binary.BigEndian.AppendUint32(b, uint32(bodyLen))
	b = binary.BigEndian.AppendUint32(b, opaque)
	return binary.BigEndian.AppendUint64(b, 0)
}

func appendSamples(path string, µs []float64) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	var b []byte
	for _, v := range µs {
		b = strconv.AppendFloat(b, v, 'f', 1, 64)
		b = append(b, '\n')
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

// median of sorted values.
func median(sorted []float64) float64 {
	m := len(sorted) / 2
	if len(sorted)%2 == 1 {
		return sorted[m]
	}
	return (sorted[m-1] + sorted[m]) / 2
}
