package failover

import (
	"testing"
	"time"
)

func TestExptime(t *testing.T) {
	now := time.Now().Unix()
	for _, c := range []struct{ in, want int64 }{
		{0, 300}, {10, 10}, {3600, 300}, {-1, -1}, {now + 60, 60}, {now + 7200, 300}, {now - 10, -1},
	} {
		got := Exptime(c.in, 5*time.Minute)
		if got != c.want && !(c.in == now+60 && got >= 59 && got <= 60) {
			t.Errorf("Exptime(%d) = %d, want %d", c.in, got, c.want)
		}
	}
}
