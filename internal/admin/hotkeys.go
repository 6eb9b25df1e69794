package admin

import (
	"encoding/base64"
	"io"
	"net/http"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moxi-proxy/moxi/internal/peers"
	"github.com/moxi-proxy/moxi/internal/topology"
)

// Invalidator drops keys from the hot cache as writes through this moxi would: the proxy.
type Invalidator interface {
	Invalidate(pool string, key []byte)
	FlushHot()
}

// maxInvalidateBody bounds one POST /invalidate: a peer's batch of lines.
const maxInvalidateBody = 8 << 20

// hotKeyJSON is one line of GET /hotkeys.
type hotKeyJSON struct {
	Pool   string  `json:"pool"`
	Server string  `json:"server"`
	Key    string  `json:"key"`
	KeyB64 string  `json:"key_b64,omitempty"` // the key, when it is not UTF-8
	RPS    float64 `json:"requests_per_s"`
	BPS    float64 `json:"bytes_per_s"`
	Share  float64 `json:"share"`
}

// HotKeys is GET /hotkeys: per pool in the topology's order, its hottest keys first, each
// with the server that serves it now. Empty without hot_keys.
func HotKeys(t *topology.Topology) []hotKeyJSON {
	out := []hotKeyJSON{}
	for _, pl := range t.Pools {
		s := t.HotKeys[pl]
		if s == nil {
			continue
		}
		for _, k := range s.Top(0) {
			key := []byte(k.Key)
			j := hotKeyJSON{Pool: pl.Name(), Server: pl.Member(pl.Locate(key)).Name, Key: k.Key,
				RPS: k.RequestsPerSecond, BPS: k.BytesPerSecond, Share: k.Share}
			if !utf8.ValidString(k.Key) {
				j.Key, j.KeyB64 = "", base64.StdEncoding.EncodeToString(key)
			}
			out = append(out, j)
		}
	}
	return out
}

// invalidate is POST /invalidate: JSON lines from a peer (package peers), all applied or,
// when one is malformed, none.
func invalidate(inv Invalidator) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxInvalidateBody))
		if err != nil {
			http.Error(w, "reading the body: "+err.Error(), http.StatusRequestEntityTooLarge)
			return
		}
		if err := peers.ParseLines(body, inv.Invalidate, inv.FlushHot); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	}
}

// HotKeyCollector exports moxi_hot_key_share{pool}: the hottest key's share of each pool's
// requests, read from the running topology's sketches at scrape time.
type HotKeyCollector struct {
	src   Topologies
	share *prometheus.Desc
}

// NewHotKeyCollector returns the collector of src's hot keys.
func NewHotKeyCollector(src Topologies) *HotKeyCollector {
	return &HotKeyCollector{src: src, share: prometheus.NewDesc("moxi_hot_key_share",
		"The hottest key's share of its pool's requests in the hot_keys window (GET /hotkeys names it); 0 until enough requests were sampled.", []string{"pool"}, nil)}
}

func (c *HotKeyCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.share }

func (c *HotKeyCollector) Collect(ch chan<- prometheus.Metric) {
	t := c.src.Topology()
	for _, pl := range t.Pools {
		if s := t.HotKeys[pl]; s != nil {
			ch <- prometheus.MustNewConstMetric(c.share, prometheus.GaugeValue, s.HottestShare(), pl.Name())
		}
	}
}
