package testlog

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// TestBufferTakesConcurrentWrites: writes from many goroutines all land,
// whole, while another goroutine reads (the race detector checks the rest).
func TestBufferTakesConcurrentWrites(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 100 {
				fmt.Fprintf(&b, "w%d-%d\n", i, j)
				_ = b.String()
			}
		})
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 800 {
		t.Fatalf("%d lines, want 800", len(lines))
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "w") || !strings.Contains(l, "-") {
			t.Fatalf("torn line %q", l)
		}
	}
}
