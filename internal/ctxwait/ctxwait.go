package ctxwait

import (
	"context"
	"time"
)

// Sleep waits for d or until ctx ends, and reports whether ctx is still
// live: false means the caller should stop.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
