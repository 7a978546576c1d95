package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/testlog"
	"github.com/voyager-gpu/voyager/internal/testreq"
	"github.com/voyager-gpu/voyager/runtime"
)

// quickStartMarker precedes the quick start's code block in README.md.
const quickStartMarker = "<!-- quick start:"

// quickStartLines returns the command lines of README.md's quick start,
// as written.
func quickStartLines(t *testing.T, readme string) []string {
	t.Helper()
	_, after, ok := strings.Cut(readme, quickStartMarker)
	if !ok {
		t.Fatalf("README.md has no %q line before the quick start's commands", quickStartMarker)
	}
	_, block, ok := strings.Cut(after, "```sh\n")
	if !ok {
		t.Fatal("README.md: no ```sh block after the quick start marker")
	}
	block, _, ok = strings.Cut(block, "```")
	if !ok {
		t.Fatal("README.md: the quick start's block does not end")
	}
	var lines []string
	for line := range strings.Lines(block) {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			lines = append(lines, line)
		}
	}
	return lines
}

// TestQuickStartLines: the extraction finds the commands and stops at the
// block's end.
func TestQuickStartLines(t *testing.T) {
	readme := "intro\n" + quickStartMarker + " x -->\n```sh\nmake image   # a comment\n\n# only a comment\nbin/voyager queue\n```\nafter\n```sh\nnot this\n```\n"
	got := quickStartLines(t, readme)
	if want := []string{"make image   # a comment", "bin/voyager queue"}; !slices.Equal(got, want) {
		t.Errorf("quickStartLines = %q, want %q", got, want)
	}
}

// TestQuickStartE2E runs README.md's quick start line by line, as written,
// in one bash in the repository's root, against `voyager dev` on its
// embedded defaults (embedded etcd; a private containerd, as on a machine
// where none runs): make image builds and loads the notebook image, a
// notebook session runs on a simulated GPU and its URL answers, voyager run
// prints hi and exits 3. Every line must succeed. It also checks that dev
// at its default log level prints its start block and no routine INFO
// lines.
func TestQuickStartE2E(t *testing.T) {
	needBinary(t)
	if os.Geteuid() != 0 {
		testreq.Missing(t, "root", "the quick start runs as root, like make dev (containerd, debootstrap)")
	}
	root, _ := filepath.Abs("../..")
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := quickStartLines(t, string(readme))

	env := newDevEnv(t)
	environ := slices.DeleteFunc(env.environ(), func(kv string) bool { return strings.HasPrefix(kv, "VOYAGER_LOG_LEVEL=") })
	environ = append(environ,
		"VOYAGER_AGENT_NODE=quickstart-e2e",
		"VOYAGER_AGENT_PORTS=44200-44299", // apart from the ports other tests' sessions use at the same time
		"PATH="+os.Getenv("PATH"))
	// The Go build make image runs and the image archive are the
	// machine's, not the test home's: a cold build cache would rebuild
	// everything, an empty image cache would debootstrap again.
	for _, v := range []string{"GOCACHE", "GOMODCACHE", "GOPATH"} {
		out, err := exec.Command("go", "env", v).Output()
		if err != nil {
			t.Fatalf("go env %s: %v", v, err)
		}
		environ = append(environ, v+"="+strings.TrimSpace(string(out)))
	}
	cache := os.Getenv("VOYAGER_IMAGE_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "voyager", "images")
	}
	environ = append(environ, "VOYAGER_IMAGE_CACHE="+cache)

	// Runs after dev is stopped (cleanups run last first): dev leaves its
	// containers running by design (a restarted agent adopts them), so
	// whatever a failed run left behind goes here, through dev's private
	// containerd started again.
	t.Cleanup(func() { removeContainers(t, filepath.Join(env.dataDir(), "containerd")) })
	dev := start(t, environ, "dev")
	dev.waitFor("voyager dev is running", 90*time.Second)
	dev.waitFor("batch ", 10*time.Second) // the block's last line
	startLog := dev.stderr()
	for _, want := range []string{"http://" + env.httpAddr + "/api/v1/", "VOYAGER_TOKEN=$(", "http://" + env.clientAddr,
		"quickstart-e2e: 8×", "made up", "session create --gpus 1 --image voyager.local/jupyter:latest -o name"} {
		if !strings.Contains(startLog, want) {
			t.Errorf("dev's start block lacks %q:\n%s", want, startLog)
		}
	}
	for line := range strings.Lines(startLog) {
		if strings.Contains(line, "level=INFO") {
			t.Errorf("dev logged a routine INFO line at start (want debug): %s", line)
		}
	}

	sh := newShell(t, root, append(environ, envURL+"=http://"+env.httpAddr))
	for i, line := range lines {
		timeout := 3 * time.Minute
		if strings.HasPrefix(line, "make ") {
			// A Go build, and where the archive is not cached a debootstrap,
			// Debian's Jupyter packages (11 minutes in a fresh Debian root on
			// a loaded 2-core machine) and JupyterLab's npm install and
			// webpack build (8 minutes at a load average of 25).
			timeout = 35 * time.Minute
		}
		out, rc := sh.run(line, timeout)
		t.Logf("$ %s\n%s(exit %d)", line, out, rc)
		if rc != 0 {
			t.Fatalf("quick start line %d failed with %d: %s\noutput:\n%s\nshell stderr:\n%s", i+1, rc, line, out, sh.stderr.String())
		}
		switch {
		case strings.Contains(line, "session get"):
			openNotebook(t, out)
		case strings.Contains(line, " run "):
			if !strings.HasSuffix(out, "hi\n3\n") {
				t.Errorf("voyager run line printed %q, want hi and then 3", out)
			}
		}
	}
	// Not the README's: wait until every session has ended (stop only asks
	// for it), so that no container outlives dev and the test.
	if out, rc := sh.run(`for s in $(bin/voyager session list -o name); do bin/voyager session wait --for end "$s" || exit 1; done`, 2*time.Minute); rc != 0 {
		t.Errorf("waiting for the sessions to end: exit %d\n%s", rc, out)
	}
	if code := dev.stop(); code != 0 {
		t.Errorf("dev exit code %d", code)
	}
}

// jupyterURL finds the notebook's URL in `voyager session get`'s output.
var jupyterURL = regexp.MustCompile(`URL jupyter:\s+(\S+)`)

// openNotebook does what a user does with the URL session get prints:
// Jupyter answers its API with the token in the URL, and in Chromium the
// URL opens JupyterLab, whose notebook runs a cell in a kernel of the
// session, not as root.
func openNotebook(t *testing.T, getOutput string) {
	t.Helper()
	m := jupyterURL.FindStringSubmatch(getOutput)
	if m == nil {
		t.Fatalf("session get printed no jupyter URL:\n%s", getOutput)
	}
	u, err := url.Parse(m[1])
	if err != nil || u.Query().Get("token") == "" {
		t.Fatalf("jupyter URL %q: want a URL with a token", m[1])
	}
	code, body := httpGet(t, fmt.Sprintf("http://%s/api/status?token=%s", u.Host, u.Query().Get("token")))
	if code != 200 || !strings.Contains(body, "last_activity") {
		t.Errorf("the notebook at %s answers /api/status with %d %s", u.Host, code, body)
	}
	if uid := labRunsACell(newBrowser(t, "notebook"), m[1], artifactDir(t)); uid == "0" {
		t.Errorf("the notebook's kernel runs as root")
	}
}

// shell is one bash that runs lines one at a time, so variables and
// exports carry from line to line as in a terminal.
type shell struct {
	t      *testing.T
	in     io.WriteCloser
	out    *bufio.Reader
	stderr *testlog.Buffer
}

func newShell(t *testing.T, dir string, environ []string) *shell {
	t.Helper()
	cmd := exec.Command("bash", "--noprofile", "--norc", "-s")
	cmd.Dir, cmd.Env = dir, environ
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	sh := &shell{t: t, in: in, out: bufio.NewReader(out), stderr: &testlog.Buffer{}}
	cmd.Stderr = sh.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		in.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	return sh
}

// rcMarker ends the output of each line, with its exit code.
const rcMarker = "::quickstart-exit-code="

// run runs line and returns what it wrote to stdout and its exit code.
func (s *shell) run(line string, timeout time.Duration) (string, int) {
	s.t.Helper()
	// The line's status is kept before the echo that ends its output.
	if _, err := fmt.Fprintf(s.in, "%s\n__quickstart_rc=$?; echo; echo %s$__quickstart_rc\n", line, rcMarker); err != nil {
		s.t.Fatalf("write to bash: %v", err)
	}
	type result struct {
		out string
		rc  int
		err error
	}
	res := make(chan result, 1)
	go func() {
		var b strings.Builder
		for {
			l, err := s.out.ReadString('\n')
			if err != nil {
				res <- result{b.String(), -1, err}
				return
			}
			if rc, ok := strings.CutPrefix(strings.TrimSuffix(l, "\n"), rcMarker); ok {
				n, _ := strconv.Atoi(rc)
				// The echo before the marker ends a last line that has no
				// newline, or adds an empty line: either way, one "\n".
				res <- result{strings.TrimSuffix(b.String(), "\n"), n, nil}
				return
			}
			b.WriteString(l)
		}
	}()
	select {
	case r := <-res:
		if r.err != nil {
			s.t.Fatalf("read from bash: %v (output so far %q)", r.err, r.out)
		}
		return r.out, r.rc
	case <-time.After(timeout):
		s.t.Fatalf("%q did not finish within %s; shell stderr:\n%s", line, timeout, s.stderr.String())
	}
	return "", -1
}

// removeContainers starts the containerd in dir again and removes every
// container in it, so that nothing the test started outlives it.
func removeContainers(t *testing.T, dir string) {
	if _, err := os.Stat(dir); err != nil {
		return // dev never started one
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := runtime.StartContainerd(ctx, dir)
	if err != nil {
		t.Errorf("start dev's containerd again to clean up: %v", err)
		return
	}
	defer func() { _ = d.Stop(10 * time.Second) }()
	rt, err := runtime.NewContainerd(ctx, runtime.ContainerdOptions{Address: d.Address, Namespace: runtime.DefaultNamespace})
	if err != nil {
		t.Errorf("connect to dev's containerd to clean up: %v", err)
		return
	}
	defer rt.Close()
	infos, err := rt.List(ctx, nil)
	if err != nil {
		t.Errorf("list containers to clean up: %v", err)
	}
	for _, in := range infos {
		if err := rt.Remove(ctx, in.ID); err != nil {
			t.Errorf("remove container %s: %v", in.ID, err)
		}
	}
}

// TestShellReportsExitCodes: the shell the quick start runs in reports
// each line's own exit code and output, and keeps variables across lines.
func TestShellReportsExitCodes(t *testing.T) {
	sh := newShell(t, t.TempDir(), []string{"PATH=" + os.Getenv("PATH")})
	for _, tt := range []struct {
		line, out string
		rc        int
	}{
		{"x=5", "", 0},
		{"echo $x", "5\n", 0},
		{"printf 'no newline'", "no newline", 0},
		{"sh -c 'echo hi; exit 3'", "hi\n", 3},
		{"sh -c 'exit 3'; echo $?", "3\n", 0},
		{"false", "", 1},
	} {
		out, rc := sh.run(tt.line, 10*time.Second)
		if out != tt.out || rc != tt.rc {
			t.Errorf("%s: output %q, exit %d; want %q, %d", tt.line, out, rc, tt.out, tt.rc)
		}
	}
}
