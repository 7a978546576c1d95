package browsertest_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/voyager-gpu/voyager/internal/browsertest"
	"github.com/voyager-gpu/voyager/internal/testreq"
)

// TestBrowserLeavesNothingInTmp starts and stops the browser with the
// test's own directory as the process's TMPDIR, and asserts that nothing
// is left there (the TMPDIR browsertest made for Chromium, with Chromium's
// singleton directory in it, was removed) nor in the host's /tmp. Other
// packages' browser tests may run meanwhile: each has a TMPDIR of its own,
// so none of theirs shows in this test's directory.
func TestBrowserLeavesNothingInTmp(t *testing.T) {
	path, err := exec.LookPath("chromium")
	if err != nil {
		testreq.Missing(t, "chromium", "the browser test drives Debian's chromium: apt-get install -y chromium")
	}
	host := os.TempDir()
	singletons := func() []string {
		m, err := filepath.Glob(filepath.Join(host, "org.chromium.Chromium.*"))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	before := singletons()
	// Short: Chromium's socket path under it must fit 108 bytes.
	dir, err := os.MkdirTemp(host, "bt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	t.Setenv("TMPDIR", dir)
	t.Run("browse", func(t *testing.T) {
		ctx := browsertest.Start(t, path, 800, 600)
		title, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.title = "ok"`))
		if err != nil || title != "ok" {
			t.Fatalf("evaluate in chromium: %q, %v", title, err)
		}
	})
	left, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range left {
		t.Errorf("chromium left %s behind", filepath.Join(dir, e.Name()))
	}
	for _, d := range singletons() {
		if !slices.Contains(before, d) {
			t.Errorf("chromium left %s behind", d)
		}
	}
}
