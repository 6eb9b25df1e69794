package main

import (
	"fmt"
	"io"
	"os"

	"github.com/moxi-proxy/moxi/internal/twemproxyconf"
)

// fromTwemproxy prints the moxi config equivalent to the nutcracker.yml at path (see
// twemproxyconf) and returns the exit code: 0, with what was left out (Redis pools) on
// stderr, or 1 with the problems on stderr.
func fromTwemproxy(path string, stdout, stderr io.Writer) int {
	data, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(stderr, "moxi: --from-twemproxy:", err)
		return 1
	}
	out, warnings, err := twemproxyconf.Convert(data, path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	for _, w := range warnings {
		fmt.Fprintln(stderr, "moxi: warning:", w)
	}
	if _, err := stdout.Write(out); err != nil {
		fmt.Fprintln(stderr, "moxi:", err)
		return 1
	}
	return 0
}
