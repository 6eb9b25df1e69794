package itemcopy

import (
	"math"
	"testing"

	"github.com/moxi-proxy/moxi/internal/protocol"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		flags string
		want  Item
	}{
		{" f7 t-1", Item{Found: true, Flags: 7, TTL: -1}},
		{" f0 t30", Item{Found: true, TTL: 30}},
		{" t5 f4294967295", Item{Found: true, Flags: math.MaxUint32, TTL: 5}},
	} {
		resp := protocol.Response{Meta: protocol.MetaAnswer{Code: protocol.MetaVA, Flags: []byte(tc.flags)}}
		if got := Parse(&resp); got.Found != tc.want.Found || got.Flags != tc.want.Flags || got.TTL != tc.want.TTL {
			t.Errorf("%q: %+v, want %+v", tc.flags, got, tc.want)
		}
	}
	if got := Parse(&protocol.Response{Meta: protocol.MetaAnswer{Code: protocol.MetaEN}}); got.Found {
		t.Error("a miss parses as found")
	}
}

func TestExptime(t *testing.T) {
	if _, ok := Exptime(0); ok {
		t.Error("an item with under a second left is copied")
	}
	if e, ok := Exptime(-1); !ok || e != 0 {
		t.Errorf("no expiry is copied as %d %v, want 0", e, ok)
	}
	if e, _ := Exptime(40 * 24 * 3600); e < 1e9 {
		t.Errorf("a TTL over 30 days is copied as %d, want an absolute time", e)
	}
}

func TestGetBase64(t *testing.T) {
	req := Get([]byte("a b"))
	if !req.Meta.Base64 || string(req.Meta.KeyToken) != "YSBi" {
		t.Errorf("a key with a space: %+v", req.Meta)
	}
	if req := Get([]byte("ab")); req.Meta.Base64 || string(req.Meta.KeyToken) != "ab" {
		t.Errorf("a text key: %+v", req.Meta)
	}
}
