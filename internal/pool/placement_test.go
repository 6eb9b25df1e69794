package pool_test

import (
	"fmt"
	"testing"

	"github.com/moxi-proxy/moxi/internal/pool"
)

// upOrDown is a server that is only alive or not: placement asks nothing else.
type upOrDown struct {
	pool.Server
	up bool
}

func (s upOrDown) Up() bool { return s.up }

// TestPlacement: Placement is Locate and Owner together, with every distribution, with
// failover and a dead member (the two then differ for its keys) and with replicas.
func TestPlacement(t *testing.T) {
	for _, d := range pool.Distributions() {
		for _, opts := range []pool.Options{{Distribution: d}, {Distribution: d, Failover: true}, {Distribution: d, Replicas: 2}} {
			var members []pool.Member
			for i, up := range []bool{true, false, true, true} {
				name := fmt.Sprintf("s%d", i)
				members = append(members, pool.Member{Name: name, Addr: name, Weight: 1, Server: upOrDown{up: up}})
			}
			p, err := pool.New("p", opts, members)
			if err != nil {
				t.Fatal(err)
			}
			moved := 0
			for i := range 2000 {
				k := []byte(fmt.Sprintf("key:%d", i))
				serving, owner := p.Placement(k)
				if serving != p.Locate(k) || owner != p.Owner(k) {
					t.Fatalf("%+v: Placement(%s) = %d, %d; Locate %d, Owner %d", opts, k, serving, owner, p.Locate(k), p.Owner(k))
				}
				if serving != owner {
					moved++
				}
			}
			if dead := opts.Failover || opts.Replicas > 1; dead != (moved > 0) {
				t.Errorf("%+v: %d keys served by another member than their owner", opts, moved)
			}
		}
	}
}
