package pool

import (
	"fmt"
	"strings"

	"github.com/moxi-proxy/moxi/internal/ketama"
)

// The defaults of a pool whose Options leave them empty, and of the config's
// `distribution` and `hash` keys.
const (
	DefaultDistribution = "ketama"
	DefaultHash         = "md5"
)

// distributions is moxi's one table of key distributions: the names the config accepts are
// exactly the names newPicker builds. It is never written after initialisation.
var distributions = [...]struct {
	name  string
	build func(nodes []ketama.Node) picker
}{
	{"ketama", func(nodes []ketama.Node) picker { return ketama.New(nodes) }},
	{"jump", func(nodes []ketama.Node) picker { return NewJump(nodeWeights(nodes)) }},
	{"modula", func(nodes []ketama.Node) picker { return NewModula(nodes) }},
}

// Distributions returns the names of the key distributions, in a new slice, in the order
// the config documents them (the default first).
func Distributions() []string {
	names := make([]string, len(distributions))
	for i, d := range distributions {
		names[i] = d.name
	}
	return names
}

// newPicker builds the picker of distribution ("" is DefaultDistribution) over nodes; its
// indices are indices into nodes. Every weight must be positive, as New checks first.
func newPicker(distribution string, nodes []ketama.Node) (picker, error) {
	if distribution == "" {
		distribution = DefaultDistribution
	}
	for _, d := range distributions {
		if d.name == distribution {
			return d.build(nodes), nil
		}
	}
	return nil, fmt.Errorf("unknown distribution %q: want one of %s",
		distribution, strings.Join(Distributions(), ", "))
}

// nodeWeights returns the nodes' weights, in order, for the distributions that need no names.
func nodeWeights(nodes []ketama.Node) []int {
	w := make([]int, len(nodes))
	for i, n := range nodes {
		w[i] = n.Weight
	}
	return w
}
