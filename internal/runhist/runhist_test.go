package runhist

import (
	"fmt"
	"testing"

	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// TestSameAsClientGolang: observations counted in runs expose exactly what client_golang's
// histogram exposes for the same observations one by one (a differential test), for the
// default buckets and for custom ones, values on and between the bounds and past the last.
func TestSameAsClientGolang(t *testing.T) {
	runs := []struct {
		label string
		value float64
		n     int
	}{
		{"get", 0.0001, 100}, {"get", 0.005, 3}, {"set", 0.0051, 7}, {"get", 42, 2}, {"set", 0, 1}, {"get", 0.25, 1},
	}
	for _, buckets := range [][]float64{nil, {0.001, 0.005, 0.1}} {
		opts := prometheus.HistogramOpts{Name: "moxi_test_seconds", Help: "A test histogram.", Buckets: buckets}
		ours := New(opts, []string{"command"})
		theirs := prometheus.NewHistogramVec(opts, []string{"command"})
		for _, r := range runs {
			ours.With(r.label).Observe(r.value, r.n)
			for range r.n {
				theirs.WithLabelValues(r.label).Observe(r.value)
			}
		}
		want, got := exposed(t, theirs), exposed(t, ours)
		if got != want {
			t.Errorf("buckets %v: runhist exposes\n%s\nclient_golang\n%s", buckets, got, want)
		}
		if !strings.Contains(got, `command=get count=106 `) {
			t.Errorf("buckets %v: no count of 106 gets:\n%s", buckets, got)
		}
	}
}

// TestObserveIgnores: a run of no observation, or of NaN, counts nothing.
func TestObserveIgnores(t *testing.T) {
	v := New(prometheus.HistogramOpts{Name: "moxi_test_seconds", Help: "h"}, nil)
	s := v.With()
	s.Observe(1, 0)
	s.Observe(0.5, -3)
	s.Observe(nanValue(), 4)
	if out := exposed(t, v); out != "moxi_test_seconds histogram h\n count=0 sum=0 le 0.005:0 le 0.01:0 le 0.025:0 le 0.05:0 le 0.1:0 le 0.25:0 le 0.5:0 le 1:0 le 2.5:0 le 5:0 le 10:0\n" {
		t.Errorf("observations counted:\n%s", out)
	}
}

// exposed is what c exposes, as a registry gathers it, in a line per series.
func exposed(t *testing.T, c prometheus.Collector) string {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, f := range families {
		fmt.Fprintf(&b, "%s %s %s\n", f.GetName(), strings.ToLower(f.GetType().String()), f.GetHelp())
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				fmt.Fprintf(&b, "%s=%s", l.GetName(), l.GetValue())
			}
			h := m.GetHistogram()
			fmt.Fprintf(&b, " count=%d sum=%g", h.GetSampleCount(), h.GetSampleSum())
			for _, bk := range h.GetBucket() {
				fmt.Fprintf(&b, " le %g:%d", bk.GetUpperBound(), bk.GetCumulativeCount())
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

func nanValue() float64 { zero := 0.0; return zero / zero }

// BenchmarkObserveRun: a run of 100 observations in one step, against client_golang's 100.
func BenchmarkObserveRun(b *testing.B) {
	s := New(prometheus.HistogramOpts{Name: "moxi_test_seconds", Help: "h"}, []string{"command"}).With("set")
	for b.Loop() {
		s.Observe(0.0003, 100)
	}
}

func BenchmarkClientGolang100(b *testing.B) {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "moxi_test_seconds", Help: "h"}, []string{"command"}).WithLabelValues("set")
	for b.Loop() {
		for range 100 {
			h.Observe(0.0003)
		}
	}
}
