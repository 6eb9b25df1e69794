package memstore

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

// TestCacheMemlimitBounded: cache_memlimit answers OK and lowers the limit, evicting down
// to it, but never raises it past the configured MaxBytes (embedded_memory_mb).
func TestCacheMemlimitBounded(t *testing.T) {
	const mb = 1 << 20
	for _, tc := range []struct {
		name   string
		limits []uint64 // cache_memlimit arguments, in megabytes, in order
		want   int64    // limit_maxbytes after them
	}{
		{"above the bound", []uint64{2048}, 64 * mb},
		{"at the bound", []uint64{64}, 64 * mb},
		{"lowered", []uint64{8}, 8 * mb},
		{"lowered then raised within the bound", []uint64{8, 32}, 32 * mb},
		{"lowered then raised past the bound", []uint64{8, 2048}, 64 * mb},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newTestStore(64 * mb)
			value := strings.Repeat("v", 100<<10)
			for i := range 120 { // 12 MB: over the lowest limit
				set(t, s, fmt.Sprintf("k%d", i), value, 0, 0)
			}
			for _, l := range tc.limits {
				if r := do(t, s, protocol.Request{Op: protocol.OpCacheMemlimit, Delta: l}); r.Status != protocol.StatusOK || r.Value != nil {
					t.Fatalf("cache_memlimit %d: %+v, want OK", l, r)
				}
			}
			if got := stat(t, s, "limit_maxbytes"); got != strconv.FormatInt(tc.want, 10) {
				t.Errorf("limit_maxbytes %s, want %d", got, tc.want)
			}
			if got, _ := strconv.ParseInt(stat(t, s, "bytes"), 10, 64); got > tc.want {
				t.Errorf("bytes %d over the limit %d", got, tc.want)
			}
		})
	}
}
