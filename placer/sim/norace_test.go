//go:build !race

package sim

// raceEnabled is false without the race detector (race_test.go).
const raceEnabled = false
