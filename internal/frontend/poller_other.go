//go:build !linux

package frontend

import "errors"

// poller is Linux's (epoll): elsewhere idle connections keep their goroutines.
type poller struct{}

var errUnsupported = errors.New("parking not supported")

func newPoller(*Server) (*poller, error)           { return nil, errUnsupported }
func (*poller) run()                               {}
func (*poller) park(*parked) bool                  { return false }
func (*poller) takeIf(func(*parked) bool) []parked { return nil }
func (*poller) count(func(*parked) bool) int       { return 0 }
func (*poller) parked() int                        { return 0 }
func (*poller) close() []parked                    { return nil }
