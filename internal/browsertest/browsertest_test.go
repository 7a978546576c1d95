package browsertest_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/voyager-gpu/voyager/internal/browsertest"
	"github.com/voyager-gpu/voyager/internal/testreq"
)

// chromiumLeftovers lists, in the host's temporary directory, the
// singleton directories Chromium makes and the temporary directories
// browsertest makes for it.
func chromiumLeftovers(t *testing.T) []string {
	t.Helper()
	var all []string
	for _, pattern := range []string{"org.chromium.Chromium.*", "voyager-chromium-*"} {
		m, err := filepath.Glob(filepath.Join(os.TempDir(), pattern))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, m...)
	}
	return all
}

// TestBrowserLeavesNothingInTmp starts and stops the browser and asserts
// that no Chromium directory is left in the host's /tmp: its singleton
// socket went to a TMPDIR of the test's own, removed when it ended.
func TestBrowserLeavesNothingInTmp(t *testing.T) {
	path, err := exec.LookPath("chromium")
	if err != nil {
		testreq.Missing(t, "chromium", "the browser test drives Debian's chromium: apt-get install -y chromium")
	}
	before := chromiumLeftovers(t)
	t.Run("browse", func(t *testing.T) {
		ctx := browsertest.Start(t, path, 800, 600)
		title, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.title = "ok"`))
		if err != nil || title != "ok" {
			t.Fatalf("evaluate in chromium: %q, %v", title, err)
		}
	})
	var added []string
	for _, d := range chromiumLeftovers(t) {
		if !slices.Contains(before, d) {
			added = append(added, d)
		}
	}
	if len(added) > 0 {
		t.Fatalf("chromium left %s behind", strings.Join(added, ", "))
	}
}
