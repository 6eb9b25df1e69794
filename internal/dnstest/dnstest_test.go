package dnstest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"
)

// TestAnswers asks Go's own resolver, the server's only client, each kind of question.
func TestAnswers(t *testing.T) {
	s := Start(t)
	s.SetIPs("mc.test", "10.0.0.1", "::1")
	s.SetSRV("_memcache._tcp.mc.test", SRV{Target: "mc-0.mc.test", Port: 11211, Weight: 2, Priority: 1})
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", s.Addr)
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lookupIP := func(network, name string) (string, error) {
		ips, err := r.LookupNetIP(ctx, network, name)
		return fmt.Sprint(ips), err
	}
	for _, tc := range []struct {
		name   string
		lookup func() (string, error)
		want   string // "": NXDOMAIN
	}{
		{"A", func() (string, error) { return lookupIP("ip4", "mc.test") }, "[10.0.0.1]"},
		{"AAAA", func() (string, error) { return lookupIP("ip6", "mc.test") }, "[::1]"},
		{"case-insensitive", func() (string, error) { return lookupIP("ip4", "MC.Test.") }, "[10.0.0.1]"},
		{"SRV", func() (string, error) {
			_, srvs, err := r.LookupSRV(ctx, "", "", "_memcache._tcp.mc.test")
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("%s:%d w%d p%d", srvs[0].Target, srvs[0].Port, srvs[0].Weight, srvs[0].Priority), nil
		}, "mc-0.mc.test.:11211 w2 p1"},
		{"NXDOMAIN", func() (string, error) { return lookupIP("ip4", "none.test") }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.lookup()
			var dnsErr *net.DNSError
			switch {
			case tc.want == "" && (!errors.As(err, &dnsErr) || !dnsErr.IsNotFound):
				t.Errorf("got %s, %v; want NXDOMAIN", got, err)
			case tc.want != "" && (err != nil || got != tc.want):
				t.Errorf("got %s, %v; want %s", got, err, tc.want)
			}
		})
	}
	if s.Queries() == 0 {
		t.Error("no query counted")
	}
}
