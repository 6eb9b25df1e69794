package test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// pipelineSeedEnv overrides TestPipelineDifferential's seed, to replay or explore.
const pipelineSeedEnv = "MOXI_PIPELINE_SEED"

// TestPipelineDifferential sends the same random pipelines to one memcached and to moxi in
// front of three (default config: ketama, dedup on), and requires byte-identical answers
// (binary cas values aside): moxi spreading keys over servers, batching and deduplicating
// must be invisible. Each stream, text or binary, has keys of its own and one connection to
// each target, so streams run side by side; pipeGen says what a pipeline holds. A
// stream sends a pipeline in one write to memcached, reads all its answers, does the same
// with moxi, and compares; the first difference fails the test with the pipeline, both
// answers and the recent history of the key involved.
func TestPipelineDifferential(t *testing.T) {
	t.Parallel() // no bound in time (a pipeline has 10 s): beside the waiting checks, off the serial path
	const pipelines = 10_000
	streams := []string{"t0", "t1", "b0", "b1"} // t: text, b: binary
	seed := uint64(20240611)
	if s := os.Getenv(pipelineSeedEnv); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", pipelineSeedEnv, s, err)
		}
	}
	t.Logf("seed %d (set %s to replay another)", seed, pipelineSeedEnv)

	ref := cluster(t, 1)[0]
	mcs := cluster(t, 3)
	moxi := startMoxi(t, "--config", writeConfig(t, poolConfig("", addrs(mcs)...)))

	start := time.Now()
	var (
		stop atomic.Bool // set by the first stream to fail; the others then end early
		wg   sync.WaitGroup
		errs = make([]error, len(streams))
		took = make([]pipeTimes, len(streams))
	)
	for i, name := range streams {
		wg.Add(1)
		go func() { // ends after its share of pipelines, or early once stop is set
			defer wg.Done()
			took[i], errs[i] = runPipeStream(seed, name, pipelines/len(streams), ref.Addr, moxi.addr, &stop)
			if errs[i] != nil {
				stop.Store(true)
			}
		}()
	}
	wg.Wait()
	t.Logf("%d pipelines on %d streams in %v", pipelines, len(streams), time.Since(start).Round(time.Millisecond))
	for i, name := range streams {
		t.Logf("stream %s: %d requests, %v waiting for memcached, %v for moxi", name, took[i].requests,
			took[i].ref.Round(time.Millisecond), took[i].moxi.Round(time.Millisecond))
	}
	for _, err := range errs {
		if err != nil {
			t.Errorf("seed %d: %v", seed, err)
		}
	}
	// The comparison means something only if moxi spread the keys over all three.
	for i, mc := range mcs {
		if n, _ := strconv.Atoi(memcachedtest.Stats(t, mc.Addr)["total_items"]); n == 0 {
			t.Errorf("server %d of 3 stored nothing: moxi did not spread the keys", i)
		}
	}
	if t.Failed() {
		t.Logf("moxi log:\n%s", lastOf(moxi.out.String(), 4<<10))
	}
}

// pipeTarget is one connection of a stream: to the reference memcached or to moxi.
type pipeTarget struct {
	c net.Conn
	r *bufio.Reader
}

func dialPipeTarget(addr string) (*pipeTarget, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	return &pipeTarget{c: c, r: bufio.NewReader(c)}, nil
}

// exchange writes wire in one write and reads the answers with read. The write runs beside
// the read, so that answers filling the socket buffers cannot block both sides; the
// deadline ends both when a target stays silent.
func (tg *pipeTarget) exchange(wire []byte, read func(*bufio.Reader) ([][]byte, error)) ([][]byte, error) {
	_ = tg.c.SetDeadline(time.Now().Add(10 * time.Second))
	written := make(chan error, 1)
	go func() { // ends when the write does, at the latest at the deadline
		_, err := tg.c.Write(wire)
		written <- err
	}()
	units, err := read(tg.r)
	if werr := <-written; err == nil && werr != nil {
		err = fmt.Errorf("write: %w", werr)
	}
	return units, err
}

// pipeTimes is how long a stream waited for each target, to tell a slow moxi from a
// slow machine.
type pipeTimes struct {
	requests  int
	ref, moxi time.Duration
}

// runPipeStream runs n pipelines of stream name against both targets.
func runPipeStream(seed uint64, name string, n int, refAddr, moxiAddr string, stop *atomic.Bool) (took pipeTimes, _ error) {
	ref, err := dialPipeTarget(refAddr)
	if err != nil {
		return took, fmt.Errorf("stream %s: dial memcached: %w", name, err)
	}
	defer ref.c.Close()
	mox, err := dialPipeTarget(moxiAddr)
	if err != nil {
		return took, fmt.Errorf("stream %s: dial moxi: %w", name, err)
	}
	defer mox.c.Close()

	g := newPipeGen(seed, name)
	textual := name[0] == 't'
	var past pipeHistory
	for i := 0; i < n && !stop.Load(); i++ {
		var reqs []pipeReq
		var read func(*bufio.Reader) ([][]byte, error)
		if textual {
			reqs = g.textPipeline()
			units := 0
			for _, r := range reqs {
				units += r.answers
			}
			read = func(r *bufio.Reader) ([][]byte, error) { return readTextUnits(r, units) }
		} else {
			reqs = g.binaryPipeline()
			read = readBinaryUntilNoop
		}
		var wire []byte
		for _, r := range reqs {
			wire = append(wire, r.wire...)
		}
		took.requests += len(reqs)
		t0 := time.Now()
		want, err := ref.exchange(wire, read)
		t1 := time.Now()
		took.ref += t1.Sub(t0)
		if err != nil {
			return took, fmt.Errorf("stream %s pipeline %d: memcached: %w\n%s", name, i, err, describePipeline(reqs, textual))
		}
		got, err := mox.exchange(wire, read)
		took.moxi += time.Since(t1)
		if !textual {
			want, got = maskCas(want), maskCas(got)
		}
		if err != nil || !slices.EqualFunc(want, got, bytes.Equal) {
			keys := culpritKeys(reqs, want, got, textual)
			return took, fmt.Errorf("stream %s pipeline %d: moxi answers differently from memcached (moxi error: %v)\n%s%s%s",
				name, i, err, describePipeline(reqs, textual), describeAnswers(reqs, want, got, textual),
				past.about(keys, textual))
		}
		past.add(i, reqs)
	}
	return took, nil
}

// readTextUnits reads n text answer units: any VALUE blocks, then the line that ends them
// (END for a get; STORED, a number, NOT_FOUND... for the rest).
func readTextUnits(r *bufio.Reader, n int) ([][]byte, error) {
	units := make([][]byte, 0, n)
	for range n {
		var unit []byte
		for {
			line, err := r.ReadSlice('\n')
			if err != nil {
				return append(units, unit), fmt.Errorf("after %d answers: %w", len(units), err)
			}
			unit = append(unit, line...)
			if !bytes.HasPrefix(line, []byte("VALUE ")) {
				break
			}
			f := strings.Fields(string(line))
			size, err := strconv.Atoi(f[len(f)-1])
			if len(f) != 4 || err != nil || size < 0 {
				return append(units, unit), fmt.Errorf("bad VALUE line %q", line)
			}
			data := make([]byte, size+2)
			if _, err := io.ReadFull(r, data); err != nil {
				return append(units, unit), fmt.Errorf("value of %q: %w", line, err)
			}
			unit = append(unit, data...)
		}
		units = append(units, unit)
	}
	return units, nil
}

// readBinaryUntilNoop reads response packets up to and including the answer to the noop
// with finalOpaque that ends every binary pipeline.
func readBinaryUntilNoop(r *bufio.Reader) ([][]byte, error) {
	var packets [][]byte
	for {
		hdr := make([]byte, 24)
		if _, err := io.ReadFull(r, hdr); err != nil {
			return packets, fmt.Errorf("after %d packets: %w", len(packets), err)
		}
		body := binary.BigEndian.Uint32(hdr[8:12])
		if hdr[0] != 0x81 || body > 1<<20 {
			return append(packets, hdr), fmt.Errorf("bad response header %x", hdr)
		}
		p := append(hdr, make([]byte, body)...)
		if _, err := io.ReadFull(r, p[24:]); err != nil {
			return append(packets, p), fmt.Errorf("body of %x: %w", hdr, err)
		}
		packets = append(packets, p)
		if p[1] == 0x0a && binary.BigEndian.Uint32(p[12:16]) == finalOpaque {
			return packets, nil
		}
	}
}

// maskCas replaces the cas of every packet by 1 when it is set: cas values differ between
// one memcached and three, but whether an answer carries one must not.
func maskCas(packets [][]byte) [][]byte {
	for _, p := range packets {
		if len(p) >= 24 && binary.BigEndian.Uint64(p[16:24]) != 0 {
			binary.BigEndian.PutUint64(p[16:24], 1)
		}
	}
	return packets
}

// maxPipeQuoted bounds each request or answer quoted in a failure, and maxPipeReport the whole.
const (
	maxPipeQuoted = 300
	maxPipeReport = 24 << 10
)

func quoteWire(b []byte) string {
	if len(b) > maxPipeQuoted {
		return fmt.Sprintf("%q... (%d bytes)", b[:maxPipeQuoted], len(b))
	}
	return strconv.Quote(string(b))
}

// describeBinary is a packet as its header fields and quoted body.
func describeBinary(p []byte) string {
	if len(p) < 24 {
		return fmt.Sprintf("short packet %x", p)
	}
	status := ""
	if p[0] == 0x81 {
		status = fmt.Sprintf(" status=%#04x", binary.BigEndian.Uint16(p[6:8]))
	}
	return fmt.Sprintf("magic=%#x op=%#02x keylen=%d extlen=%d%s opaque=%#x cas=%d body=%s",
		p[0], p[1], binary.BigEndian.Uint16(p[2:4]), p[4], status,
		binary.BigEndian.Uint32(p[12:16]), binary.BigEndian.Uint64(p[16:24]), quoteWire(p[24:]))
}

// describeWire is a request or answer, quoted for text, as its fields for binary.
func describeWire(b []byte, textual bool) string {
	if textual {
		return quoteWire(b)
	}
	return describeBinary(b)
}

func describePipeline(reqs []pipeReq, textual bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "pipeline (%d requests, one write):\n", len(reqs))
	for i, r := range reqs {
		fmt.Fprintf(&b, "  %2d: %s\n", i, describeWire(r.wire, textual))
	}
	return boundReport(b.String())
}

// firstDifference is the index of the first answer that differs (or is missing on one side).
func firstDifference(want, got [][]byte) int {
	i := 0
	for i < min(len(want), len(got)) && bytes.Equal(want[i], got[i]) {
		i++
	}
	return i
}

// answerOwners is the index in reqs of the request each text answer belongs to.
func answerOwners(reqs []pipeReq) []int {
	var idx []int
	for i, r := range reqs {
		for range r.answers {
			idx = append(idx, i)
		}
	}
	return idx
}

// describeAnswers lists both sides' answers, marking where they first differ.
func describeAnswers(reqs []pipeReq, want, got [][]byte, textual bool) string {
	var b strings.Builder
	first := firstDifference(want, got)
	fmt.Fprintf(&b, "first difference at answer %d (memcached gave %d answers, moxi %d)\n", first, len(want), len(got))
	owner := answerOwners(reqs)
	for _, side := range []struct {
		name  string
		units [][]byte
	}{{"memcached", want}, {"moxi", got}} {
		fmt.Fprintf(&b, "%s:\n", side.name)
		for i, u := range side.units {
			mark := "  "
			if i == first {
				mark = "=>"
			}
			of := ""
			if textual && i < len(owner) {
				of = fmt.Sprintf(" (request %d)", owner[i])
			}
			fmt.Fprintf(&b, "%s%2d%s: %s\n", mark, i, of, describeWire(u, textual))
		}
	}
	return boundReport(b.String())
}

// requestKeys are the keys a request names.
func requestKeys(wire []byte, textual bool) []string {
	if textual {
		line, _, _ := bytes.Cut(wire, []byte("\r\n"))
		f := strings.Fields(string(line))
		if f[0] == "get" {
			return f[1:]
		}
		return f[1:2]
	}
	keyLen, extLen := int(binary.BigEndian.Uint16(wire[2:4])), int(wire[4])
	if keyLen == 0 {
		return nil
	}
	return []string{string(wire[24+extLen : 24+extLen+keyLen])}
}

// culpritKeys are the keys of the request whose answer differs first: found by position
// for text, by opaque (on either side) for binary; all the pipeline's keys if none is.
func culpritKeys(reqs []pipeReq, want, got [][]byte, textual bool) []string {
	first := firstDifference(want, got)
	var keys []string
	if textual {
		if owner := answerOwners(reqs); first < len(owner) {
			keys = requestKeys(reqs[owner[first]].wire, true)
		}
	} else {
		for _, side := range [][][]byte{want, got} {
			if first >= len(side) || len(side[first]) < 24 {
				continue
			}
			opaque := side[first][12:16]
			for _, r := range reqs {
				if bytes.Equal(r.wire[12:16], opaque) {
					keys = append(keys, requestKeys(r.wire, false)...)
				}
			}
		}
	}
	if len(keys) == 0 {
		for _, r := range reqs {
			keys = append(keys, requestKeys(r.wire, textual)...)
		}
	}
	return keys
}

// pipeHistory is a stream's recent requests, to show what led to a difference.
type pipeHistory struct {
	sent []pipeSent // the last pipeHistoryLen to 2*pipeHistoryLen requests, oldest first
}

type pipeSent struct {
	pipeline int
	wire     []byte
}

// pipeHistoryLen is how many past requests a stream keeps at least; pipeHistoryShown how
// many of those naming a failing request's keys a failure lists.
const (
	pipeHistoryLen   = 5000
	pipeHistoryShown = 40
)

func (h *pipeHistory) add(pipeline int, reqs []pipeReq) {
	if len(h.sent) >= 2*pipeHistoryLen {
		h.sent = append(h.sent[:0], h.sent[len(h.sent)-pipeHistoryLen:]...)
	}
	for _, r := range reqs {
		h.sent = append(h.sent, pipeSent{pipeline, r.wire})
	}
}

// about lists the last requests of earlier pipelines that name any of keys.
func (h *pipeHistory) about(keys []string, textual bool) string {
	var lines []string
	for i := len(h.sent) - 1; i >= 0 && len(lines) < pipeHistoryShown; i-- {
		s := h.sent[i]
		for _, k := range requestKeys(s.wire, textual) {
			if slices.Contains(keys, k) {
				lines = append(lines, fmt.Sprintf("  pipeline %d: %s\n", s.pipeline, describeWire(s.wire, textual)))
				break
			}
		}
	}
	slices.Reverse(lines)
	return boundReport(fmt.Sprintf("earlier requests naming %q (last %d, oldest first):\n%s", keys, pipeHistoryShown, strings.Join(lines, "")))
}

func boundReport(s string) string {
	if len(s) > maxPipeReport {
		return s[:maxPipeReport] + fmt.Sprintf("\n... (%d more bytes)\n", len(s)-maxPipeReport)
	}
	return s
}

func lastOf(s string, n int) string { return s[max(0, len(s)-n):] }
