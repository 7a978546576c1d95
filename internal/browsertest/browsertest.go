package browsertest

import (
	"context"
	"os"
	"testing"

	"github.com/chromedp/chromedp"
)

// Options returns the allocator options for headless Chromium at path with
// a window of width×height: no sandbox (tests run as root), no GPU, and a
// profile and a TMPDIR of tb's own, both removed when tb ends (after the
// browser stops, where Start or the caller stops it in a cleanup or a
// defer registered after Options).
func Options(tb testing.TB, path string, width, height int) []chromedp.ExecAllocatorOption {
	tb.Helper()
	// Not under tb.TempDir: the path of Chromium's singleton socket,
	// $TMPDIR/org.chromium.Chromium.XXXXXX/SingletonSocket, must fit a
	// socket address (108 bytes), and a test's name can be long.
	tmp, err := os.MkdirTemp("", "voyager-chromium-")
	if err != nil {
		tb.Fatalf("make chromium's temporary directory: %v", err)
	}
	tb.Cleanup(func() {
		if err := os.RemoveAll(tmp); err != nil {
			tb.Errorf("remove chromium's temporary directory: %v", err)
		}
	})
	return append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.WindowSize(width, height),
		chromedp.UserDataDir(tb.TempDir()),
		chromedp.Env("TMPDIR="+tmp))
}

// Start starts headless Chromium at path (see Options) and returns the
// context of its first tab. The browser stops when tb ends, before its
// directories are removed; tb fails if the browser cannot start.
func Start(tb testing.TB, path string, width, height int) context.Context {
	tb.Helper()
	opts := Options(tb, path, width, height)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(alloc)
	tb.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil {
		tb.Fatalf("start chromium: %v", err)
	}
	return ctx
}
