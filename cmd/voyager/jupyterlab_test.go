package main

import (
	"strings"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// labRunsACell opens JupyterLab at url in b, as a researcher would: it
// waits for Lab's shell and launcher, opens a Python notebook from the
// launcher, types a cell and runs it with Shift+Enter, and waits for the
// kernel's answer in the cell's output. The cell prints the kernel's uid,
// which it returns, and 6*7, which the output must show: only a running
// kernel computes it. shots, if not empty, is where it leaves screenshots.
func labRunsACell(b *browserTab, url, shots string) string {
	b.t.Helper()
	b.do("open "+url, chromedp.Navigate(url))
	// JupyterLab's own shell (not the classic notebook's or Jupyter
	// Server's pages), laid out with its launcher.
	waitPage(b, "JupyterLab's shell and launcher", `document.querySelector('#main.jp-LabShell') !== null &&
		document.querySelector('.jp-Launcher .jp-LauncherCard[data-category="Notebook"]') !== null`, 3*time.Minute)
	if shots != "" {
		b.shot(shots, "lab-launcher")
	}
	b.do("open a Python notebook from the launcher", chromedp.Click(`.jp-Launcher .jp-LauncherCard[data-category="Notebook"]`))
	// The status bar names the kernel once the notebook has started one,
	// and says Idle once it answers.
	waitPage(b, "the notebook's kernel idle", `(() => {
		const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
		const status = document.querySelector('#jp-main-statusbar');
		return panel !== null && panel.querySelector('.jp-Cell .CodeMirror') !== null &&
			status !== null && /Python 3[^|]*\|\s*Idle/.test(status.innerText);
	})()`, 2*time.Minute)
	b.do("type a cell and run it",
		chromedp.Click(`.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell .CodeMirror`),
		chromedp.KeyEvent(`import os; print("uid", os.getuid(), "answer", 6*7)`),
		chromedp.KeyEvent(kb.Enter, chromedp.KeyModifiers(chromedp.ModifierShift)))
	waitPage(b, "the cell's output", `(() => {
		const out = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell .jp-OutputArea-output');
		return out !== null && /answer 42/.test(out.innerText);
	})()`, 2*time.Minute)
	if shots != "" {
		b.shot(shots, "lab-cell")
	}
	out := js[string](b, `document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell .jp-OutputArea-output').innerText`)
	f := strings.Fields(out)
	if len(f) < 2 || f[0] != "uid" {
		b.t.Fatalf("%s: the cell printed %q, want uid N answer 42", b.name, out)
	}
	return f[1]
}
