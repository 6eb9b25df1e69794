package frontend

import (
	"strconv"
	"time"

	"github.com/moxi-proxy/moxi/internal/protocol"
	"github.com/moxi-proxy/moxi/internal/reqlog"
)

// Showing requests to the operators watching them (Server.RequestLog, GET /requests). While
// nobody watches, a request pays one atomic load where it starts and one where its answer
// is written, and a socket read one more.

// Locator is a Handler that can say where a key goes: a watched request names its pool and
// server.
type Locator interface {
	Locate(key []byte) (pool, server string)
}

// noteRead records when the bytes just read arrived: the first of a request's is its start
// (task.firstByte, took.go).
func (c *conn) noteRead() {
	now := time.Now()
	c.lastRead = now
	if c.reqFirst.IsZero() {
		c.reqFirst = now
	}
}

// decoded moves the first-byte instant on past the request just decoded: the next one's
// first byte is already here when input is buffered, else it comes with the next read.
func (c *conn) decoded() {
	c.reqStarted = c.reqFirst
	if c.buffered()+len(c.pending) > 0 {
		c.reqFirst = c.lastRead
	} else {
		c.reqFirst = time.Time{}
	}
}

// snapshot keeps, while someone watches, what the request log needs of t's requests: their
// bytes are not t's to keep (a request the reader runs points into its buffer), so their
// keys are copied, into a buffer t keeps for the next time.
func (c *conn) snapshot(t *task) {
	if !c.s.RequestLog.Watching() {
		return
	}
	if c.client == "" {
		c.client = c.nc.RemoteAddr().String()
		if loc, ok := c.handler.(Locator); ok {
			c.locate = loc.Locate
		}
	}
	user := ""
	if l := c.login.Load(); l != nil {
		user = l.user
	}
	var ends []int
	add := func(r *protocol.Request) {
		rec := reqlog.Record{Client: c.client, User: user, Command: r.Op.String(), Locate: c.locate, Bytes: r.DataBytes()}
		key := r.Key
		if r.Op.IsRetrieval() && len(r.Keys) > 0 {
			key, rec.Keys = r.Keys[0], len(r.Keys)
		} else if key != nil {
			rec.Keys = 1
		}
		t.logKeys = append(t.logKeys, key...)
		ends = append(ends, len(t.logKeys))
		t.logged = append(t.logged, rec)
	}
	if t.single {
		for i := range t.batch {
			add(&t.batch[i])
		}
	} else {
		add(&t.req)
	}
	at := 0
	for i := range t.logged {
		if rec := &t.logged[i]; rec.Keys > 0 {
			rec.Key = t.logKeys[at:ends[i]:ends[i]]
		}
		at = ends[i]
	}
}

// noteAnswers records, while t's requests are logged, what resps answer: every request of a
// run, or t's request (a part of it, for a multi-key get answered in parts). Called before
// the answers are encoded and let go.
func (c *conn) noteAnswers(t *task, resps []protocol.Response) {
	if len(t.logged) == 0 {
		return
	}
	if t.single {
		for i := range t.logged {
			if i < len(resps) {
				rec := &t.logged[i]
				rec.Status, rec.Error = answerStatus(rec, resps[i:i+1], &t.logTally)
				rec.Bytes += len(resps[i].Value)
				t.logTally = tally{}
			}
		}
		return
	}
	rec := &t.logged[0]
	rec.Status, rec.Error = answerStatus(rec, resps, &t.logTally)
	for i := range resps {
		rec.Bytes += len(resps[i].Value)
	}
}

// logWritten offers t's requests, their answers written at now, to the request log.
func (c *conn) logWritten(t *task, now time.Time) {
	for i := range t.logged {
		rec := &t.logged[i]
		if rec.Status == "" {
			continue // never answered (a broken connection)
		}
		rec.Time, rec.Took = now, now.Sub(t.firstByte)
		c.s.RequestLog.Offer(rec)
	}
}

// tally is what the parts of a multi-key get answered so far.
type tally struct {
	hits, keys int
	err        string
}

// answerStatus names the outcome of a request answered with resps (after the parts tally
// counts), and reports whether it is an error answer: hit or miss ("3 of 5 hit" for a
// multi-key get), ok, not_stored, server_error…
func answerStatus(rec *reqlog.Record, resps []protocol.Response, sofar *tally) (string, bool) {
	if len(resps) == 0 && sofar.keys == 0 {
		return "none", false
	}
	retrieval := rec.Keys > 1 || rec.Command == "get" || rec.Command == "gets" || rec.Command == "gat" || rec.Command == "gats" || rec.Command == "mg"
	if !retrieval {
		return statusName(resps[0].Status)
	}
	for i := range resps {
		switch name, isErr := statusName(resps[i].Status); {
		case resps[i].Status == protocol.StatusOK:
			sofar.hits++
		case isErr && sofar.err == "":
			sofar.err = name
		}
	}
	sofar.keys += len(resps)
	switch {
	case sofar.err != "":
		return sofar.err, true
	case sofar.keys > 1:
		return strconv.Itoa(sofar.hits) + " of " + strconv.Itoa(sofar.keys) + " hit", false
	case sofar.hits == 1:
		return "hit", false
	}
	return "miss", false
}

func statusName(s protocol.Status) (string, bool) {
	switch s {
	case protocol.StatusOK:
		return "ok", false
	case protocol.StatusNotFound:
		return "not_found", false
	case protocol.StatusExists:
		return "exists", false
	case protocol.StatusNotStored:
		return "not_stored", false
	case protocol.StatusNonNumeric:
		return "non_numeric", true
	case protocol.StatusTooLarge:
		return "too_large", true
	case protocol.StatusInvalid:
		return "client_error", true
	case protocol.StatusNoMemory:
		return "out_of_memory", true
	case protocol.StatusUnknownCommand:
		return "error", true
	case protocol.StatusTempFailure:
		return "server_error", true
	case protocol.StatusAuthError:
		return "refused", true
	}
	return "unknown", true
}
