package admin

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/moxi-proxy/moxi/internal/reqlog"
)

// streamWriteBound bounds one write of GET /requests: the admin server's WriteTimeout would
// end the stream after two minutes, so each write moves the deadline on; a watcher that
// reads nothing for this long is gone (its lines were dropped meanwhile, never waited for).
const streamWriteBound = 30 * time.Second

// streamBatch bounds the lines written at once when several are queued.
const streamBatch = 64 << 10

// requestsFilter is GET /requests' query: slow=DURATION, sample=F, errors=1, prefix=P.
func requestsFilter(q url.Values) (reqlog.Filter, error) {
	var f reqlog.Filter
	if v := q.Get("slow"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return f, fmt.Errorf("slow=%q: want a duration such as 5ms", v)
		}
		f.Slow = d
	}
	if v := q.Get("sample"); v != "" {
		x, err := strconv.ParseFloat(v, 64)
		if err != nil || !(x > 0 && x <= 1) {
			return f, fmt.Errorf("sample=%q: want a fraction in (0, 1]", v)
		}
		f.Sample = x
	}
	if v := q.Get("errors"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return f, fmt.Errorf("errors=%q: want 1 or 0", v)
		}
		f.Errors = b
	}
	if v := q.Get("prefix"); v != "" {
		f.Prefix = []byte(v)
	}
	return f, nil
}

// watchRequests is GET /requests: a live stream of the requests log's lines that f takes,
// until the client goes.
func watchRequests(log *reqlog.Log) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f, err := requestsFilter(r.URL.Query())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		watcher, err := log.Watch(f)
		if errors.Is(err, reqlog.ErrTooMany) {
			http.Error(w, err.Error(), http.StatusTooManyRequests)
			return
		}
		defer watcher.Close()
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Time{}) // the request is read: the stream outlives ReadTimeout
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusOK)
		if rc.Flush() != nil {
			return
		}
		var batch []byte
		for {
			select {
			case <-r.Context().Done():
				return
			case line := <-watcher.Lines():
				batch = append(batch[:0], line...)
			more:
				for len(batch) < streamBatch {
					select {
					case line := <-watcher.Lines():
						batch = append(batch, line...)
					default:
						break more
					}
				}
				_ = rc.SetWriteDeadline(time.Now().Add(streamWriteBound))
				if _, err := w.Write(batch); err != nil || rc.Flush() != nil {
					return
				}
			}
		}
	}
}
