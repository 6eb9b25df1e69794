package twemproxyconf

import (
	"testing"

	"github.com/moxi-proxy/moxi/internal/config"
)

// FuzzConvert: any input is converted or refused with an error, never a panic, and what is
// converted is a config moxi accepts.
func FuzzConvert(f *testing.F) {
	f.Add([]byte("alpha:\n  listen: 127.0.0.1:22121\n  hash: fnv1a_64\n  distribution: ketama\n  servers:\n   - 127.0.0.1:11211:1\n"))
	f.Add([]byte("beta:\n  servers: [\"127.0.0.1:11212:2 b1\"]\n  auto_eject_hosts: true\n  server_retry_timeout: 2000\n"))
	f.Add([]byte("gamma:\n  redis: true\n  servers: [127.0.0.1:6379:1]\n"))
	f.Add([]byte("\t- not yaml"))
	f.Fuzz(func(t *testing.T, data []byte) {
		out, _, err := Convert(data, "nutcracker.yml")
		if err != nil {
			return
		}
		if _, err := config.Parse(out, "converted.yaml"); err != nil {
			t.Fatalf("converted config refused: %v\ninput:\n%s\noutput:\n%s", err, data, out)
		}
	})
}
