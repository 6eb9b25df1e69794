//go:build accept

package test

import "testing"

// TestAcceptZones is the zone figure: 10,000 keys through a proxy in zone b of
// three zones × two servers.
func TestAcceptZones(t *testing.T) { zonesRun(t, 10_000) }
