package topology

import (
	"github.com/moxi-proxy/moxi/internal/config"
	"github.com/moxi-proxy/moxi/internal/hotkeys"
	"github.com/moxi-proxy/moxi/internal/pool"
)

// hotKeysOf gives each pool of t its heavy-hitters sketch (hot_keys): the sketch the
// committed topology's pool of the same name counts in, so that a reload keeps what was
// seen, or a new one when the pool is new or hot_keys changed.
func (b *Builder) hotKeysOf(pd *Pending, cfg *config.Config) {
	t := pd.Topology
	if !cfg.HotKeys.Enabled {
		return
	}
	hk := cfg.HotKeys
	sc := hotkeys.Config{Top: hk.Top, Sample: hk.Sample, Window: hk.Window, MinShare: hk.MinShare}
	pd.hotKeys = make(map[string]*hotkeys.Sketch, len(t.Pools))
	t.HotKeys = make(map[*pool.Pool]*hotkeys.Sketch, len(t.Pools))
	t.AbsorbHot = hk.Cache
	for _, pl := range t.Pools {
		s := b.hotKeys[pl.Name()]
		if s == nil || b.hotKeysConfig != sc {
			s = hotkeys.New(sc)
		}
		pd.hotKeys[pl.Name()] = s
		t.HotKeys[pl] = s
	}
	pd.hotKeysConfig = sc
}

// HotKey reports whether key of pl is answered from the hot cache: it has one of
// hot_cache's prefixes, or (hot_keys.cache) pl's sketch finds it hot now.
func (t *Topology) HotKey(pl *pool.Pool, key []byte) bool {
	if t.Hot == nil {
		return false
	}
	if t.Hot.Hot(key) {
		return true
	}
	return t.AbsorbHot && t.HotKeys[pl].Hot(key)
}

// ExportHotKeys is what each pool's sketch has counted, by pool name, for a successor's
// ImportHotKeys (an upgrade in place); nil when hot_keys is off.
func (t *Topology) ExportHotKeys() map[string]hotkeys.SketchState {
	if t.HotKeys == nil {
		return nil
	}
	states := make(map[string]hotkeys.SketchState, len(t.HotKeys))
	for pl, s := range t.HotKeys {
		states[pl.Name()] = s.Export()
	}
	return states
}

// ImportHotKeys seeds each pool's sketch with the state its predecessor exported for the
// pool of the same name, so that the keys hot before the upgrade are hot, and absorbed by
// the hot cache, from the first request. States of pools t does not have are ignored, and
// with hot_keys off there is nothing to seed.
func (t *Topology) ImportHotKeys(states map[string]hotkeys.SketchState) {
	for pl, s := range t.HotKeys {
		if st, ok := states[pl.Name()]; ok {
			s.Import(st)
		}
	}
}
