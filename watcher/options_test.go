package watcher

import (
	"testing"
	"time"
)

func TestBackoffIsBoundedAndJittered(t *testing.T) {
	b := backoff{min: 10 * time.Millisecond, max: 80 * time.Millisecond}
	steps := []time.Duration{10, 20, 40, 80, 80, 80}
	for round := range 2 {
		for i, step := range steps {
			step *= time.Millisecond
			if d := b.next(); d < step/2 || d > step {
				t.Fatalf("round %d, wait %d = %v, want within [%v, %v]", round, i, d, step/2, step)
			}
		}
		b.reset() // the second round starts from min again
	}
}
