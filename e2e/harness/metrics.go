package harness

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// MetricSum gathers cs and sums the series of metric name whose labels include every given
// name/value pair. seen is false when no collector has the metric at all (a vector whose
// series were never emitted is not gathered, so its callers decide what that means).
func MetricSum(t testing.TB, cs []prometheus.Collector, name string, labels ...string) (sum float64, seen bool) {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(cs...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		seen = true
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue series
				}
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum, seen
}
