package test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/memcachedtest"
)

// The attacks below are what a careless or hostile client can do to a proxy that every
// application shares, each measured from outside: moxi's peak RSS and a small client's
// latency beside it. Helpers are in attack_helpers_test.go.

// TestAttackRepeatedKey: a get that names one 1 MB value a thousand times asks, with a
// 4 KB request, for a 1 GB answer. moxi holds the value once and writes the answer as it
// encodes it, a piece at a time, to clients that read it. Each attacker first makes the
// average value size moxi has seen small (multi-gets of a 1-byte value), so that the get
// is answered in one part (measured before the fix: 1.9 GB).
func TestAttackRepeatedKey(t *testing.T) {
	mc := memcachedtest.Start(t, "-m", "1024")
	storeAttackValue(t, mc.Addr)
	runSiege(t, mc.Addr, siege{conns: 2, dur: 4 * time.Second, attack: readRepeated(1000)})
}

// readRepeated sets a 1-byte value, reads it in 100 multi-gets of 20 keys, then asks for
// big, named n times in one get, and reads the answers, again and again until the attack
// ends.
func readRepeated(n int) attackFunc {
	teach := []byte("get" + strings.Repeat(" small", 20) + "\r\n")
	ask := []byte("get" + strings.Repeat(" big", n) + "\r\n")
	return func(ctx context.Context, _ int, nc net.Conn) error {
		_ = nc.SetDeadline(time.Now().Add(60 * time.Second))
		br := bufio.NewReaderSize(nc, 1<<20)
		untilEnd := func() error {
			for {
				line, err := br.ReadSlice('\n')
				if err != nil && err != bufio.ErrBufferFull {
					return err
				}
				if bytes.Equal(line, []byte("END\r\n")) {
					return nil
				}
			}
		}
		if _, err := nc.Write([]byte("set small 0 0 1\r\nx\r\n")); err != nil {
			return err
		}
		if _, err := br.ReadString('\n'); err != nil {
			return err
		}
		for range 100 {
			if _, err := nc.Write(teach); err != nil {
				return err
			}
			if err := untilEnd(); err != nil {
				return fmt.Errorf("teaching: %w", err)
			}
		}
		for ctx.Err() == nil {
			if _, err := nc.Write(ask); err != nil {
				return err
			}
			if err := untilEnd(); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("reading the repeated value: %w", err)
			}
		}
		return nil
	}
}
