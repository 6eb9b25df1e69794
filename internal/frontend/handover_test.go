package frontend_test

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/moxi-proxy/moxi/internal/frontend"
)

// TestHandOverAndAdopt: clients idle and pipelining, text and binary, on one server are
// handed to another at request boundaries: none sees a close or an error, every request
// is answered, the first server keeps none, and the second serves them all.
func TestHandOverAndAdopt(t *testing.T) {
	h := newProxy(t)
	old, next := &frontend.Server{Handler: h}, &frontend.Server{Handler: h}
	oldLn, nextLn := listenLoopback(t), listenLoopback(t)
	servePlain(t, old, oldLn)
	servePlain(t, next, nextLn)
	const clients = 300
	var cs []*client
	for i := range clients {
		c := dial(t, oldLn.Addr().String())
		c.send(fmt.Appendf(nil, "set k%d 0 0 2\r\nv%d\r\n", i, i%10))
		c.expect("STORED\r\n")
		cs = append(cs, c)
	}
	// A third of them are busy while the handover runs.
	stop := make(chan struct{})
	busy := make(chan error, clients/3)
	for i := 0; i < clients; i += 3 {
		c := cs[i]
		go func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					busy <- nil
					return
				default:
				}
				if _, err := c.nc.Write(fmt.Appendf(nil, "get k%d\r\nget k%d\r\n", i, i)); err != nil {
					busy <- err
					return
				}
				want := fmt.Sprintf("VALUE k%d 0 2\r\nv%d\r\nEND\r\n", i, i%10)
				for range 2 {
					got := make([]byte, len(want))
					if _, err := io.ReadFull(c.r, got); err != nil || string(got) != want {
						busy <- fmt.Errorf("client %d: %q %v", i, got, err)
						return
					}
				}
			}
		}()
	}
	time.Sleep(50 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	handed := 0
	left, _, err := old.HandOver(ctx, func(frontend.Handler) string { return "main" }, func(batch []frontend.Handed) error {
		for _, hd := range batch {
			if hd.Listener != "main" {
				t.Errorf("handed for listener %q", hd.Listener)
			}
			if err := next.Adopt(h, hd); err != nil {
				return err
			}
			handed++
		}
		return nil
	})
	if err != nil || left != 0 {
		t.Fatalf("HandOver: %d left, %v", left, err)
	}
	close(stop)
	for range clients / 3 {
		if err := <-busy; err != nil {
			t.Fatal(err)
		}
	}
	if cur, _ := old.Connections(); cur != 0 || handed != clients {
		t.Fatalf("after the handover the old server holds %d connections; %d handed of %d", cur, handed, clients)
	}
	for i, c := range cs {
		c.send(fmt.Appendf(nil, "get k%d\r\n", i))
		c.expect(fmt.Sprintf("VALUE k%d 0 2\r\nv%d\r\nEND\r\n", i, i%10))
	}
	if cur, _ := next.Connections(); cur != clients {
		t.Fatalf("the new server holds %d connections, want %d", cur, clients)
	}
}

// TestAdoptBeforeServe: a successor may adopt connections before its listeners serve (its
// predecessor hands them over as soon as it is ready): they are served all the same, and
// pipelined requests on them too, whether Serve comes after or at the same time.
func TestAdoptBeforeServe(t *testing.T) {
	h := newProxy(t)
	for _, together := range []bool{false, true} {
		old, next := &frontend.Server{Handler: h}, &frontend.Server{Handler: h}
		oldLn := listenLoopback(t)
		servePlain(t, old, oldLn)
		const clients = 20
		var cs []*client
		for i := range clients {
			c := dial(t, oldLn.Addr().String())
			c.send(fmt.Appendf(nil, "set a%d 0 0 1\r\n%d\r\n", i, i%10))
			c.expect("STORED\r\n")
			cs = append(cs, c)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		serving := make(chan struct{})
		if together {
			go func() { servePlain(t, next, listenLoopback(t)); close(serving) }()
		}
		_, _, err := old.HandOver(ctx, func(frontend.Handler) string { return "main" }, func(batch []frontend.Handed) error {
			for _, hd := range batch {
				if err := next.Adopt(h, hd); err != nil {
					return err
				}
			}
			return nil
		})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if !together {
			servePlain(t, next, listenLoopback(t))
			close(serving)
		}
		<-serving
		for i, c := range cs {
			c.send(fmt.Appendf(nil, "get a%d\r\nget a%d\r\n", i, i))
			want := fmt.Sprintf("VALUE a%d 0 1\r\n%d\r\nEND\r\n", i, i%10)
			c.expect(want + want)
		}
	}
}
