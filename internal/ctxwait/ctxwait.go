// Package ctxwait waits for a time or a context, whichever ends first: the
// one pause of every retry and back-off loop in Voyager's components.
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
