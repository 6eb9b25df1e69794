package test

import (
	"io"
	"strings"
	"testing"
	"time"
)

// TestStartedGetBesideWrites: a multi-key get started while a write of one of its keys is in
// flight (pipelined behind it, so the write's answer has not come back yet), and naming
// another key more than once (so that it follows its own fetch, dedup), answers every key:
// the key being written is fetched too, after the write, never left unanswered. Each
// pipeline goes in one write, as a client pipelines; 300 of them, answers compared byte for
// byte with what memcached answers.
func TestStartedGetBesideWrites(t *testing.T) {
	mc := cluster(t, 1)
	moxi := startMoxi(t, "--config", writeConfig(t, poolConfig("", addrs(mc)...)))
	c, r := dialConn(t, moxi.addr)
	const pipeline = "set sg:a 0 0 1\r\nx\r\ndelete sg:k\r\nget sg:a sg:k sg:a sg:a\r\n"
	const want = "STORED\r\nNOT_FOUND\r\nVALUE sg:a 0 1\r\nx\r\nVALUE sg:a 0 1\r\nx\r\nVALUE sg:a 0 1\r\nx\r\nEND\r\n"
	got := make([]byte, len(want))
	for i := range 300 {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, pipeline); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(r, got); err != nil {
			t.Fatalf("pipeline %d: %v after %q", i, err, got)
		}
		if string(got) != want {
			t.Fatalf("pipeline %d answered\n%q\nwant\n%q", i, got, want)
		}
		if strings.Contains(string(got), "sg:k") {
			t.Fatalf("pipeline %d: the deleted key was answered: %q", i, got)
		}
	}
}
