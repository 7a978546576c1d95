package promfunc

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestSetReadsAtScrape: a Set's metrics carry the voyager_<subsystem>_
// name, the type asked for, the constant labels, and the value their
// function has when they are gathered, not when they were made.
func TestSetReadsAtScrape(t *testing.T) {
	var n atomic.Int64
	var on atomic.Bool
	s := Set{Subsystem: "test", Labels: prometheus.Labels{"node": "n1"}}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s.Counter("things_total", "Things.", n.Load), s.Gauge("up", "Up.", Flag(on.Load)))
	n.Store(3)
	on.Store(true)
	want := `
# HELP voyager_test_things_total Things.
# TYPE voyager_test_things_total counter
voyager_test_things_total{node="n1"} 3
# HELP voyager_test_up Up.
# TYPE voyager_test_up gauge
voyager_test_up{node="n1"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	on.Store(false)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(strings.Replace(want, `voyager_test_up{node="n1"} 1`, `voyager_test_up{node="n1"} 0`, 1)), "voyager_test_up"); err != nil {
		t.Fatal(err)
	}
}
