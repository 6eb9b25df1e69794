package pool

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/moxi-proxy/moxi/internal/ketama"
)

// TestNewPicker ties the distribution table to what it builds: every listed name builds
// its own picker, "" builds the default, and nothing else builds.
func TestNewPicker(t *testing.T) {
	nodes := weightedNodes(1, 2, 3)
	tests := []struct {
		distribution string
		want         picker
	}{
		{"ketama", ketama.New(nodes)},
		{"jump", NewJump([]int{1, 2, 3})},
		{"modula", NewModula(nodes)},
		{"", ketama.New(nodes)},
	}
	for _, tt := range tests {
		t.Run(tt.distribution, func(t *testing.T) {
			got, err := newPicker(tt.distribution, nodes)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("newPicker(%q) = %T, want %T placing keys alike", tt.distribution, got, tt.want)
			}
		})
	}
	var tested []string
	for _, tt := range tests {
		if tt.distribution != "" {
			tested = append(tested, tt.distribution)
		}
	}
	if !slices.Equal(Distributions(), tested) {
		t.Errorf("Distributions() = %v; this test covers %v", Distributions(), tested)
	}
}

func TestDefaultDistributionListed(t *testing.T) {
	if d := Distributions(); len(d) == 0 || d[0] != DefaultDistribution {
		t.Errorf("Distributions() = %v, want %q first", d, DefaultDistribution)
	}
}

// TestNewPickerUnknown: the error names every valid distribution, so a typo in a config
// that bypassed validation still tells the operator what to write.
func TestNewPickerUnknown(t *testing.T) {
	_, err := newPicker("random", weightedNodes(1))
	if err == nil {
		t.Fatal("newPicker(random) succeeded")
	}
	want := `unknown distribution "random": want one of ` + strings.Join(Distributions(), ", ")
	if err.Error() != want {
		t.Errorf("error = %q, want %q", err, want)
	}
}

func TestDistributionsIsACopy(t *testing.T) {
	Distributions()[0] = "changed"
	if Distributions()[0] != DefaultDistribution {
		t.Error("Distributions returned the table itself")
	}
}
