package console_test

import (
	"context"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/voyager-gpu/voyager/internal/browsertest"
)

// startBrowser starts headless chromium (the binary at path) with a window
// of 1200×height and a profile of its own, stopped when the test ends. It
// returns the browser's context and eval, which runs a JavaScript
// expression there and fails the test if it cannot.
func startBrowser(t *testing.T, path string, height int) (context.Context, func(expr string) string) {
	t.Helper()
	bctx := browsertest.Start(t, path, 1200, height)
	return bctx, func(expr string) string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[string](expr))
		if err != nil {
			t.Fatalf("evaluate %s: %v", expr, err)
		}
		return v
	}
}
