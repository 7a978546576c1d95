//go:build race

package sim

// raceEnabled: the race detector slows the simulator about tenfold, and a
// run's goroutines are the same for every seed, so TestSuiteGoals runs
// seed 1 only under it.
const raceEnabled = true
