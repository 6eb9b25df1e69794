package reload

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/moxi-proxy/moxi/internal/config"
)

// describeChanges says what a reload changed, one line each, and what it could not change
// without a restart (compared with startup, the config moxi started with).
func describeChanges(prev, next, startup *config.Config) string {
	var b strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	for _, np := range next.Pools {
		pp := prev.Pool(np.Name)
		switch {
		case pp == nil:
			line("pool %s: added", np.Name)
		case !samePool(pp, np):
			line("pool %s: changed", np.Name)
		}
	}
	for _, pp := range prev.Pools {
		if next.Pool(pp.Name) == nil {
			line("pool %s: removed", pp.Name)
		}
	}
	if !reflect.DeepEqual(prev.Routes, next.Routes) || prev.DefaultPool != next.DefaultPool {
		line("routes: changed")
	}
	if prev.Dedup != next.Dedup || !reflect.DeepEqual(prev.HotCache, next.HotCache) || !reflect.DeepEqual(prev.FireAndForget.Prefixes, next.FireAndForget.Prefixes) {
		line("dedup, hot_cache or fire_and_forget prefixes: changed")
	}
	restart := func(what string, changed bool) {
		if changed {
			line("%s: changed in the file, takes effect at the next restart", what)
		}
	}
	restart("listen", startup.Listen != next.Listen)
	restart("admin", startup.Admin != next.Admin)
	restart("limits", startup.Limits != next.Limits)
	restart("fire_and_forget.max_pending", startup.FireAndForget.MaxPending != next.FireAndForget.MaxPending)
	if b.Len() == 0 {
		return "no changes\n"
	}
	return b.String()
}

// samePool compares two pools' settings, ignoring where in the file they were written.
func samePool(a, b *config.Pool) bool {
	ac, bc := *a, *b
	ac.Servers, bc.Servers = withoutLines(a.Servers), withoutLines(b.Servers)
	return reflect.DeepEqual(ac, bc)
}

func withoutLines(servers []config.Server) []config.Server {
	out := make([]config.Server, len(servers))
	for i, s := range servers {
		s.Line = 0
		out[i] = s
	}
	return out
}
