package migrate

import (
	"bufio"
	"context"
	"net"
	"testing"
	"time"
)

// TestDumpWaitsForBusyCrawler: in a tier every proxy lists OLD; memcached answers BUSY to
// a listing while another runs, and the copy waits for it instead of failing.
func TestDumpWaitsForBusyCrawler(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for i := 0; ; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = bufio.NewReader(c).ReadString('\n')
			if i < 2 {
				_, _ = c.Write([]byte("BUSY currently processing crawler request\r\n"))
			} else {
				_, _ = c.Write([]byte("key=a exp=-1 la=1 cas=1 fetch=no cls=1 size=65\r\nEND\r\n"))
			}
			c.Close()
		}
	}()
	o := newOldServer(ln.Addr().String(), 1, time.Second, 1<<20, nil)
	defer o.close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var keys []string
	if err := o.dump(ctx, func(e DumpEntry) error { keys = append(keys, string(e.Key)); return nil }); err != nil {
		t.Fatalf("dump: %v", err)
	}
	if len(keys) != 1 || keys[0] != "a" {
		t.Errorf("listed %q, want [a]", keys)
	}
}
