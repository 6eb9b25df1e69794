package pool

import (
	"testing"
	"time"
)

func TestStandInExptime(t *testing.T) {
	pl, err := New("p", Options{FailoverTTL: 5 * time.Minute}, []Member{{Name: "a", Addr: "embedded/0", Weight: 1, Server: nil}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().Unix()
	for _, c := range []struct{ in, want int64 }{
		{0, 300}, {10, 10}, {3600, 300}, {-1, -1}, {now + 60, 60}, {now + 7200, 300}, {now - 10, -1},
	} {
		got := pl.standInExptime(c.in)
		if got != c.want && !(c.in == now+60 && got >= 59 && got <= 60) {
			t.Errorf("standInExptime(%d) = %d, want %d", c.in, got, c.want)
		}
	}
}
