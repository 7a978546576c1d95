package promfunc

import "github.com/prometheus/client_golang/prometheus"

// Set makes the metrics of one subsystem: voyager_<Subsystem>_<name>,
// each with Labels (nil: none).
type Set struct {
	Subsystem string
	Labels    prometheus.Labels
}

// Counter is the counter voyager_<Subsystem>_<name>: f's value at each
// scrape (f only grows).
func (s Set) Counter(name, help string, f func() int64) prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: "voyager", Subsystem: s.Subsystem, Name: name, Help: help, ConstLabels: s.Labels,
	}, func() float64 { return float64(f()) })
}

// Gauge is the gauge voyager_<Subsystem>_<name>: f's value at each scrape.
func (s Set) Gauge(name, help string, f func() float64) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "voyager", Subsystem: s.Subsystem, Name: name, Help: help, ConstLabels: s.Labels,
	}, f)
}

// Flag is 1 while on reports true, else 0: a gauge's value for a state.
func Flag(on func() bool) func() float64 {
	return func() float64 {
		if on() {
			return 1
		}
		return 0
	}
}
