//go:build race

package main

// raceEnabled builds the binary under test with -race when the tests run
// with it, so the race detector watches the real process too.
const raceEnabled = true
