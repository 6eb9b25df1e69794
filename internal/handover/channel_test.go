package handover

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"reflect"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// pair returns both ends of a handover socket as Channels, closed when the test ends.
func pair(t *testing.T) (parent, child *Channel) {
	t.Helper()
	parent, childFile, err := Pair()
	if err != nil {
		t.Fatal(err)
	}
	child, err = FromFile(childFile)
	childFile.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { parent.Close(); child.Close() })
	// A test that goes wrong fails instead of hanging.
	deadline := time.Now().Add(time.Minute)
	parent.SetDeadline(deadline)
	child.SetDeadline(deadline)
	return parent, child
}

// pipes makes n pipes, closed when the test ends.
func pipes(t *testing.T, n int) (r, w []*os.File) {
	t.Helper()
	for range n {
		pr, pw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		r, w = append(r, pr), append(w, pw)
	}
	t.Cleanup(func() { closeAll(r); closeAll(w) })
	return r, w
}

type received struct {
	records []ConnRecord
	files   []*os.File
	batches []int
}

// recvConnsInto runs RecvConns on ch in a goroutine, collecting into got what it receives
// (fail, when set, decides each batch's fate); the result arrives once it has returned, and
// got may be read from then on.
func recvConnsInto(ch *Channel, got *received, fail func(batch int) error) <-chan error {
	done := make(chan error, 1)
	go func() {
		done <- RecvConns(ch, func(rs []ConnRecord, fs []*os.File) error {
			got.batches = append(got.batches, len(rs))
			got.records = append(got.records, rs...)
			got.files = append(got.files, fs...)
			if fail != nil {
				return fail(len(got.batches))
			}
			return nil
		})
	}()
	return done
}

func TestSendConns600Descriptors(t *testing.T) {
	parent, child := pair(t)
	const n = 600
	readEnds, writeEnds := pipes(t, n)
	records := make([]ConnRecord, n)
	for i := range records {
		records[i] = ConnRecord{
			Listener: "127.0.0.1:11211", Binary: i%2 == 0, Sniffed: true, User: "u" + strconv.Itoa(i),
			Unread: []byte(fmt.Sprintf("get key%d\r\n", i)), KeyEstimate: int64(i) * 1000,
			FailedLogins: int32(i % 3), Affinity: uint32(i),
		}
	}

	var got received
	done := recvConnsInto(child, &got, nil)
	acked, err := SendConns(parent, records, readEnds, 0)
	if err != nil || acked != n {
		t.Fatalf("SendConns: %d acked, %v", acked, err)
	}
	// The old process lets go of what was acknowledged; the successor's copies must not care.
	closeAll(readEnds)
	if err := parent.Send(Done{}, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("RecvConns: %v", err)
	}
	defer closeAll(got.files)

	if want := []int{253, 253, 94}; !reflect.DeepEqual(got.batches, want) {
		t.Errorf("batches %v, want %v", got.batches, want)
	}
	if !reflect.DeepEqual(got.records, records) {
		t.Fatal("records changed on the way")
	}
	if len(got.files) != n {
		t.Fatalf("%d descriptors, want %d", len(got.files), n)
	}
	// Each descriptor arrived in its record's place: it reads what its pipe's write end says.
	buf := make([]byte, 64)
	for i, f := range got.files {
		msg := fmt.Sprintf("pipe %d", i)
		if _, err := writeEnds[i].WriteString(msg); err != nil {
			t.Fatal(err)
		}
		k, err := f.Read(buf)
		if err != nil || string(buf[:k]) != msg {
			t.Fatalf("descriptor %d read %q, %v; want %q", i, buf[:k], err, msg)
		}
	}
}

func TestSendConnsSplitsByBytes(t *testing.T) {
	parent, child := pair(t)
	// Four connections of 4 MiB unread input each: over 16 MiB, so two batches, and each
	// far over a socket's buffer, so sendmsg writes part and the reader reads in pieces.
	readEnds, _ := pipes(t, 4)
	records := make([]ConnRecord, 4)
	for i := range records {
		records[i].Unread = bytes.Repeat([]byte{byte('a' + i)}, MaxUnreadBytes)
	}
	var got received
	done := recvConnsInto(child, &got, nil)
	if acked, err := SendConns(parent, records, readEnds, MaxFDs); err != nil || acked != 4 {
		t.Fatalf("SendConns: %d acked, %v", acked, err)
	}
	parent.Send(Done{}, nil)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	defer closeAll(got.files)
	if want := []int{3, 1}; !reflect.DeepEqual(got.batches, want) {
		t.Errorf("batches %v, want %v", got.batches, want)
	}
	if !reflect.DeepEqual(got.records, records) {
		t.Error("records changed on the way")
	}
}

func TestSendConnsStopsAtRefusedBatch(t *testing.T) {
	parent, child := pair(t)
	readEnds, _ := pipes(t, 600)
	records := make([]ConnRecord, 600)
	refuse := errors.New("out of descriptors")
	var got received
	done := recvConnsInto(child, &got, func(batch int) error {
		if batch == 2 {
			return refuse
		}
		return nil
	})
	acked, err := SendConns(parent, records, readEnds, 100)
	var fail Fail
	if !errors.As(err, &fail) || fail.Reason != refuse.Error() {
		t.Errorf("SendConns: %v, want the successor's Fail", err)
	}
	// The refused batch stays the sender's: it goes on serving those connections.
	if acked != 100 {
		t.Errorf("%d acked, want 100", acked)
	}
	if err := <-done; !errors.Is(err, refuse) {
		t.Errorf("RecvConns: %v, want handle's error", err)
	}
	closeAll(got.files)
}

func TestListenersAndState(t *testing.T) {
	parent, child := pair(t)
	var files []*os.File
	var ls []Listener
	for _, kind := range []Kind{KindListen, KindAdmin} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		f, err := l.(*net.TCPListener).File()
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		files = append(files, f)
		ls = append(ls, Listener{Addr: l.Addr().String(), Kind: kind})
	}
	state := State{Sections: map[string]json.RawMessage{"health": json.RawMessage(`{"mc1":"up"}`)}}

	errc := make(chan error, 1)
	go func() {
		if err := parent.Send(Hello{Version: Version, PID: os.Getpid()}, nil); err != nil {
			errc <- err
			return
		}
		if err := parent.Send(Listeners{Listeners: ls}, files); err != nil {
			errc <- err
			return
		}
		errc <- parent.Send(state, nil)
	}()

	hello, _, err := Await[Hello](child)
	if err != nil || hello.PID != os.Getpid() {
		t.Fatalf("hello %+v, %v", hello, err)
	}
	gotLs, lfiles, err := Await[Listeners](child)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(lfiles)
	if !reflect.DeepEqual(gotLs.Listeners, ls) {
		t.Errorf("listeners %+v, want %+v", gotLs.Listeners, ls)
	}
	for i, f := range lfiles {
		l, err := net.FileListener(f)
		if err != nil {
			t.Fatal(err)
		}
		if l.Addr().String() != ls[i].Addr {
			t.Errorf("descriptor %d listens on %s, want %s", i, l.Addr(), ls[i].Addr)
		}
		l.Close()
	}
	gotState, _, err := Await[State](child)
	if err != nil || !reflect.DeepEqual(gotState, state) {
		t.Fatalf("state %+v, %v", gotState, err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func TestRecvVersionMismatch(t *testing.T) {
	parent, child := pair(t)
	if _, err := parent.conn.Write(append(header(Version+1, typeHello, 6), 0, 2, 0, 0, 0, 1)); err != nil {
		t.Fatal(err)
	}
	_, _, err := child.Recv()
	if !errors.Is(err, ErrVersion) {
		t.Fatalf("%v, want ErrVersion", err)
	}
	t.Log(err)
}

func TestRecvRefusesOversizedBeforeAllocating(t *testing.T) {
	parent, child := pair(t)
	// The header alone, claiming 4 GiB: Recv must refuse it without waiting for a payload
	// that never comes (the deadline would end the test) and without allocating it.
	if _, err := parent.conn.Write(header(Version, typeState, math.MaxUint32)); err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, err := child.Recv()
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("%v, want ErrTooLarge", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Errorf("allocated %d bytes", grew)
	}
}

func TestRecvDescriptorsOnWrongMessage(t *testing.T) {
	parent, child := pair(t)
	r, _ := pipes(t, 1)
	b, _ := AppendMessage(nil, Ready{})
	fd, err := sysfd(r[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := parent.conn.WriteMsgUnix(b, syscall.UnixRights(fd), nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := child.Recv(); !errors.Is(err, ErrMalformed) {
		t.Fatalf("%v, want ErrMalformed", err)
	}
}

func TestRecvDeadline(t *testing.T) {
	_, child := pair(t)
	child.SetDeadline(time.Now().Add(20 * time.Millisecond))
	if _, _, err := child.Recv(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%v, want a deadline error", err)
	}
}

func TestRecvClosed(t *testing.T) {
	parent, child := pair(t)
	parent.Close()
	if _, _, err := child.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("%v, want io.EOF", err)
	}

	parent, child = pair(t)
	b, _ := AppendMessage(nil, Hello{Version: Version, PID: 1})
	parent.conn.Write(b[:len(b)-1])
	parent.Close()
	if _, _, err := child.Recv(); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("%v, want io.ErrUnexpectedEOF", err)
	}
}

func TestFromEnv(t *testing.T) {
	t.Setenv(EnvFD, "")
	if ch, ok, err := FromEnv(); ch != nil || ok || err != nil {
		t.Fatalf("unset: %v, %v, %v", ch, ok, err)
	}
	for _, bad := range []string{"x", "1", "-4"} {
		t.Setenv(EnvFD, bad)
		if _, ok, err := FromEnv(); !ok || err == nil {
			t.Errorf("%s=%s: %v, %v; want an error", EnvFD, bad, ok, err)
		}
	}

	parent, childFile, err := Pair()
	if err != nil {
		t.Fatal(err)
	}
	defer parent.Close()
	defer childFile.Close()
	// FromEnv closes the descriptor it is given, as a child closes its inherited one.
	fd, err := syscall.Dup(int(childFile.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvFD, strconv.Itoa(fd))
	child, ok, err := FromEnv()
	if !ok || err != nil {
		t.Fatalf("FromEnv: %v, %v", ok, err)
	}
	defer child.Close()
	if err := parent.Send(Ready{}, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Await[Ready](child); err != nil {
		t.Fatal(err)
	}
}

func TestFromFileRefusesDatagramSocket(t *testing.T) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	a, b := os.NewFile(uintptr(fds[0]), "a"), os.NewFile(uintptr(fds[1]), "b")
	defer a.Close()
	defer b.Close()
	if ch, err := FromFile(a); err == nil {
		ch.Close()
		t.Fatal("a datagram socket made a Channel")
	}
}

func TestSendChecksDescriptorCount(t *testing.T) {
	parent, _ := pair(t)
	if err := parent.Send(Conns{Conns: make([]ConnRecord, 2)}, nil); err == nil {
		t.Error("sent two records without descriptors")
	}
}

func TestAwaitFail(t *testing.T) {
	parent, child := pair(t)
	parent.Send(Fail{Reason: "config: bad"}, nil)
	_, _, err := Await[Ready](child)
	var fail Fail
	if !errors.As(err, &fail) || fail.Reason != "config: bad" {
		t.Fatalf("%v, want the Fail", err)
	}
	parent.Send(Done{}, nil)
	if _, _, err := Await[Ready](child); err == nil {
		t.Fatal("Done awaited as Ready")
	}
}
