package apitest

import (
	"context"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/api"
)

// Run starts a's watchers, waits until they have synced (at most ten
// seconds), and stops them when tb ends, failing it if Run returned an
// error.
func Run(tb testing.TB, a *api.API) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("api Run: %v", err)
		}
	})
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	defer scancel()
	if err := a.WaitSynced(sctx); err != nil {
		tb.Fatal(err)
	}
}
