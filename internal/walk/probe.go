//go:build walkprobe

package walk

import (
	"os"
	"runtime"
	"strings"
	"sync"
)

// The probe build appends one line per Step to the file MOXI_WALK_FILE names: the
// caller's function as docs/architecture.md names it (frontend.conn.serve), in the order
// the steps ran, whichever goroutines ran them. A test build only: a process-wide file.
var (
	mu  sync.Mutex
	out *os.File // nil: MOXI_WALK_FILE unset, nothing recorded
)

func init() {
	if path := os.Getenv("MOXI_WALK_FILE"); path != "" {
		out, _ = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	}
}

// Step records its caller as a step of the request path.
func Step() {
	if out == nil {
		return
	}
	pc, _, _, ok := runtime.Caller(1)
	if !ok {
		return
	}
	name := Name(runtime.FuncForPC(pc).Name())
	mu.Lock()
	defer mu.Unlock()
	out.WriteString(name + "\n")
}

// Name is a function's runtime name as the page writes it: package, type and method,
// without the module path or the pointer receiver's marks
// ("github.com/moxi-proxy/moxi/internal/frontend.(*conn).serve" → "frontend.conn.serve").
func Name(runtimeName string) string {
	if i := strings.LastIndexByte(runtimeName, '/'); i >= 0 {
		runtimeName = runtimeName[i+1:]
	}
	return strings.NewReplacer("(*", "", ")", "").Replace(runtimeName)
}
