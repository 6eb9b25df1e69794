package memstore

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
	"github.com/moxi-proxy/moxi/internal/pool"
	"github.com/moxi-proxy/moxi/internal/protocol"
)

// metaSentinel ends every script: its answer tells the reader that memcached is done.
const (
	metaSentinel       = "ms zzend 3\r\nEND\r\nmg zzend v Ozz\r\n"
	metaSentinelAnswer = "HD\r\nVA 3 Ozz\r\nEND\r\n"
)

// metaScript is the differential script: every meta flag memcached 1.6.18 accepts, base64
// keys both ways, quiet mode ended by mn, the errors of bad requests, and values at and over
// memcached's item size limit.
func metaScript() []string {
	long := strings.Repeat("a", 251)
	opaque33 := "O" + strings.Repeat("9", 32)
	// "big" (3 bytes) with flags 0: memcached's largest value is 1048576-59-3.
	const bigMax = 1048576 - 59 - 3
	return []string{
		"mn\r\n",
		"mg miss\r\n",
		"mg miss v s t c f k O1\r\n",
		"ms foo 3 T0 F5\r\nbar\r\n",
		"mg foo v s t f c k O2 h l\r\n",
		"mg foo h\r\n",
		"mg foo u s\r\n",
		"mg foo q k\r\n",
		"mg foo Pabc Lxyz s\r\n",
		// base64: set by base64, read by plain name, and the other way round.
		"ms Zm9vYg== 3 b k c O3\r\nxyz\r\n",
		"mg foob v k\r\n",
		"ms plain 5\r\nhello\r\n",
		"mg cGxhaW4= b v k\r\n",
		"mg bm9wZQ== b k O4\r\n",
		"ms IGEgYg== 1 b k\r\nx\r\n",
		"mg IGEgYg== b k v\r\n",
		// TTLs, in flag order.
		"ms ttl 2 T100\r\nhi\r\n",
		"mg ttl t v\r\n",
		"mg ttl T200 t\r\n",
		"mg ttl t T300\r\n",
		"mg ttl t\r\n",
		// Invalidation, win / stale / already-won tokens.
		"ms ttl 2 I C999999\r\nyo\r\n",
		"md ttl I T30\r\n",
		"mg ttl v\r\n",
		"mg ttl v\r\n",
		"ms ttl 3 I C1\r\nnew\r\n",
		"mg ttl v t\r\n",
		"ms ttl 3\r\nfre\r\n",
		"mg ttl v\r\n",
		"mg viv N30 v t c\r\n",
		"mg viv N30 v t\r\n",
		"mg viv s v\r\n",
		"mg rc R30 v t\r\n",
		"ms rc 1 T10\r\nx\r\n",
		"mg rc R30 t\r\n",
		"mg rc R30 t\r\n",
		// ms modes and cas.
		"ms add 1 ME\r\na\r\n",
		"ms add 1 ME\r\nb\r\n",
		"ms add 2 MA\r\nbc\r\n",
		"ms add 1 MP\r\nz\r\n",
		"mg add v\r\n",
		"ms nope 1 MR\r\nx\r\n",
		"ms nope 1 MA\r\nx\r\n",
		"ms nope 1 MP N30\r\nx\r\n",
		"ms add 1 MR c\r\nr\r\n",
		"ms add 1 C1 c\r\nq\r\n",
		"ms nope 1 C1 c\r\nq\r\n",
		"ms add 1 MS F7 T0 k O5 c\r\ns\r\n",
		"mg add f v c\r\n",
		// cas values: both servers count them alike, so a script can name them.
		"ms add 1 C15 c\r\nw\r\n",
		"md add C16 I T40\r\n",
		"mg add v c t\r\n",
		"ms add 1 I C16\r\nu\r\n",
		"mg add v c t\r\n",
		"md add C18 q\r\n",
		"mg add v\r\n",
		// An item's key is echoed in base64 only when ms b stored it.
		"mg dml2Yg== b N30 k\r\n",
		"ms Zm9vYg== 1 b\r\nx\r\n",
		"ms foob 1 MA\r\ny\r\n",
		"mg Zm9vYg== b k v\r\n",
		"ms exp 1 T-1\r\nx\r\n",
		"mg exp v\r\n",
		"ms k2 1 I\r\nx\r\n",
		"mg k2 v\r\n",
		"ms fe 1\r\nx\r\n",
		"touch fe 0\r\n",
		"mg fe h\r\n",
		"ms qq 1 q k O2\r\nx\r\n",
		"ms qq 1 q ME O3\r\nx\r\n",
		"mg qq q k O1\r\n",
		"mn\r\n",
		"ms nviv 1 N30\r\nx\r\n",
		// Quiet mode, ended by mn.
		"ms q1 1 q\r\na\r\n",
		"ms q1 1 q ME\r\nb\r\n",
		"mg q1 q v\r\n",
		"mg qmiss q v\r\n",
		"md q1 q\r\n",
		"md q1 q O7\r\n",
		"ma qn q\r\n",
		"ma qn q N0 J3 v\r\n",
		"mn\r\n",
		// ma.
		"ma cnt\r\n",
		"ma cnt N0 J10 v t c\r\n",
		"ma cnt v MD D3 q\r\n",
		"ma cnt v\r\n",
		"ma cnt MI D100 v T50 t\r\n",
		"mg cnt t v\r\n",
		"ma cnt M+ v k O8\r\n",
		"ma cnt M- D1000 v\r\n",
		"ma cnt C1 v\r\n",
		"ma cnt C0 v c\r\n",
		"ma Y250 b v N0 J5 k\r\n",
		"mg Y25 v\r\n",
		"ms nn 3\r\nabc\r\n",
		"ma nn\r\n",
		"ms e 0\r\n\r\n",
		"ma e\r\n",
		"ma cnt " + opaque33 + "\r\n",
		"mg cnt v\r\n",
		// md.
		"md nope\r\n",
		"md add C1\r\n",
		"md add k O9\r\n",
		"md Zm9vYg== b k\r\n",
		"mg foob v\r\n",
		// Bad requests.
		"mg k x\r\n",
		"mg k E5\r\n",
		"mg k v v\r\n",
		"mg k T1x\r\n",
		"mg abc b\r\n",
		"mg k \xff\r\n",
		"mg k a b c d e f g h i j k l m n o p q r\r\n",
		"md k x\r\n",
		"md k " + opaque33 + "\r\n",
		"ma k Mx\r\n",
		"ma k MI2\r\n",
		"ms k S3\r\nabc\r\n",
		"ms k 3 S3\r\nabc\r\n",
		"ms k 3 x\r\nabc\r\n",
		"ms k 3 MX\r\nabc\r\n",
		"ms k 1 Fx\r\na\r\n",
		"ms k 1 " + opaque33 + "\r\na\r\n",
		"ms k 3\r\nabcd\r\n",
		"ms k\r\n",
		"mg " + long + " v\r\n",
		"ms " + long + " 3\r\nabc\r\n",
		"mg miss " + opaque33 + "\r\n",
		"mg foo " + opaque33 + "\r\n",
		"mx k\r\n",
		// memcached's item size limit, for ms and set.
		"ms big 1\r\nb\r\n",
		"ms big " + strconv.Itoa(bigMax+1) + "\r\n" + strings.Repeat("v", bigMax+1) + "\r\n",
		"mg big s\r\n",
		"ms big " + strconv.Itoa(bigMax) + " c\r\n" + strings.Repeat("v", bigMax) + "\r\n",
		"mg big s\r\n",
		"ms big " + strconv.Itoa(bigMax) + " F1\r\n" + strings.Repeat("v", bigMax) + "\r\n",
		"mg big s\r\n",
		"set big 0 0 " + strconv.Itoa(bigMax+1) + "\r\n" + strings.Repeat("v", bigMax+1) + "\r\n",
		"set big 0 0 " + strconv.Itoa(bigMax) + "\r\n" + strings.Repeat("v", bigMax) + "\r\n",
		"ms big 1048577\r\n" + strings.Repeat("v", 1048577) + "\r\n",
		"mg big s\r\n",
		"mn\r\n",
	}
}

// metaAsk sends script in one write to a memcached at addr and returns everything it
// answers, up to the sentinel's answer.
func metaAsk(t *testing.T, addr, script string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	go func() { _, _ = io.WriteString(c, script+metaSentinel) }()
	var out bytes.Buffer
	buf := make([]byte, 64<<10)
	for !bytes.HasSuffix(out.Bytes(), []byte(metaSentinelAnswer)) {
		n, err := c.Read(buf)
		out.Write(buf[:n])
		if err != nil {
			t.Fatalf("reading memcached's answers: %v after %q", err, out.String())
		}
	}
	return strings.TrimSuffix(out.String(), metaSentinelAnswer)
}

var (
	metaCasRe = regexp.MustCompile(` c[0-9]+`)
	metaTTLRe = regexp.MustCompile(` t([0-9]+)`)
	metaLRe   = regexp.MustCompile(` l[0-9]+`)
)

// metaMask hides what may differ between two correct answers: cas values (each server
// counts its own), and a second that ticked between a TTL being set and shown (TTLs in the
// script are multiples of 10, so rounding up to one keeps them checked).
func metaMask(s string) string {
	s = metaCasRe.ReplaceAllString(s, " c#")
	s = metaLRe.ReplaceAllString(s, " l#")
	return metaTTLRe.ReplaceAllStringFunc(s, func(m string) string {
		n, _ := strconv.Atoi(m[2:])
		return " t" + strconv.Itoa((n+9)/10*10)
	})
}

// metaRun decodes script as moxi's front end does, has each request answered by do (nil
// for a request the decoder answers itself) and returns the answers as AppendTextResponse
// writes them.
func metaRun(t *testing.T, script string, do func(*protocol.Request, []protocol.Response), unlink func(key []byte)) string {
	t.Helper()
	d := protocol.NewTextReader(bufio.NewReader(strings.NewReader(script)), protocol.DefaultLimits())
	var req protocol.Request
	resps := make([]protocol.Response, 1)
	var out []byte
	for {
		err := d.Read(&req)
		var re *protocol.RequestError
		switch {
		case errors.As(err, &re):
			out = protocol.AppendTextError(out, re)
			if re.Unlink != nil {
				unlink(re.Unlink)
			}
			if re.Close {
				return string(out)
			}
			continue
		case err == io.EOF:
			return string(out)
		case err != nil:
			t.Fatalf("decoding the script: %v", err)
		}
		resps[0] = protocol.Response{}
		do(&req, resps)
		out = protocol.AppendTextResponse(out, &req, resps)
	}
}

// metaCompare fails the test with the first line where got and want differ.
func metaCompare(t *testing.T, got, want string) {
	t.Helper()
	if got == want {
		return
	}
	g, w := strings.SplitAfter(got, "\n"), strings.SplitAfter(want, "\n")
	for i := 0; i < len(g) || i < len(w); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			t.Fatalf("answer line %d: got %.200q, memcached %.200q\n(got %d lines, memcached %d)", i+1, gl, wl, len(g), len(w))
		}
	}
}

// TestMetaDifferential: the script's answers from the embedded store, through the text
// codec, are byte for byte memcached 1.6.18's own, cas values masked.
func TestMetaDifferential(t *testing.T) {
	script := strings.Join(metaScript(), "")
	mc := memcachedtest.Start(t)
	want := metaAsk(t, mc.Addr, script)

	s := New(Options{})
	ctx := context.Background()
	got := metaRun(t, script, func(req *protocol.Request, resps []protocol.Response) {
		if err := pool.Do(ctx, s, nil, req, resps); err != nil {
			t.Fatal(err)
		}
	}, func(key []byte) {
		del := protocol.Request{Op: protocol.OpDelete, Key: key}
		_ = pool.Do(ctx, s, nil, &del, make([]protocol.Response, 1))
	})
	metaCompare(t, metaMask(got), metaMask(want))
}

// TestMetaThroughMemcached: what the proxy does with a meta request (decode, strip q and
// forward with AppendMetaRequest, read the answer with ReadMetaAnswer, render it with
// AppendTextResponse, which applies q) gives memcached's own answer to the original
// request, byte for byte.
func TestMetaThroughMemcached(t *testing.T) {
	script := strings.Join(metaScript(), "")
	direct := memcachedtest.Start(t)
	want := metaAsk(t, direct.Addr, script)

	backend := memcachedtest.Start(t)
	c, err := net.DialTimeout("tcp", backend.Addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	lim := protocol.DefaultLimits()
	var wire []byte
	roundTrip := func(req *protocol.Request, resp *protocol.Response) {
		wire = protocol.AppendMetaRequest(wire[:0], req)
		if _, err := c.Write(wire); err != nil {
			t.Fatal(err)
		}
		if err := protocol.ReadMetaAnswerFor(br, lim, protocol.MetaThroughMN(req), resp); err != nil {
			t.Fatalf("answer to %q: %v", wire[:min(len(wire), 80)], err)
		}
	}
	got := metaRun(t, script, func(req *protocol.Request, resps []protocol.Response) {
		if !req.Op.IsMeta() {
			// The script's text set and touch: the proxy sends them on as text.
			wire = protocol.AppendTextRequest(wire[:0], req)
			if _, err := c.Write(wire); err != nil {
				t.Fatal(err)
			}
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if line == "STORED\r\n" || line == "TOUCHED\r\n" {
				resps[0] = protocol.Response{}
			} else {
				resps[0] = protocol.Response{Status: protocol.StatusTooLarge}
			}
			return
		}
		roundTrip(req, &resps[0])
	}, func(key []byte) {
		del := protocol.Request{Op: protocol.OpMetaDelete,
			Meta: protocol.MetaRequest{KeyToken: base64.StdEncoding.AppendEncode(nil, key), Flags: []protocol.MetaFlag{{Letter: 'b'}}}}
		var resp protocol.Response
		roundTrip(&del, &resp)
	})
	metaCompare(t, metaMask(got), metaMask(want))
	// Both servers count cas the same way from the same start, so nothing needs masking.
	metaCompare(t, got, want)
}
