package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"sigs.k8s.io/yaml"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/internal/testreq"
	"github.com/voyager-gpu/voyager/state"
)

// TestNormalizeArgs: single-dash long flags become double-dash ones for
// the command being parsed; shorthands, values and what follows -- stay.
func TestNormalizeArgs(t *testing.T) {
	tests := []struct {
		name string
		in   []string
		want []string
	}{
		{"long flags of a leaf", []string{"token", "-sub", "ada", "-admin"}, []string{"token", "--sub", "ada", "--admin"}},
		{"with =", []string{"dev", "-log-level=debug"}, []string{"dev", "--log-level=debug"}},
		{"shorthand and its value", []string{"session", "get", "-o", "json", "s1"}, []string{"session", "get", "-o", "json", "s1"}},
		{"glued shorthand", []string{"session", "get", "-ojson", "s1"}, []string{"session", "get", "-ojson", "s1"}},
		{"flag after argument", []string{"session", "get", "s1", "-output", "yaml"}, []string{"session", "get", "s1", "--output", "yaml"}},
		{"nothing after --", []string{"run", "-image", "x", "--", "sh", "-c", "echo -image"}, []string{"run", "--image", "x", "--", "sh", "-c", "echo -image"}},
		{"a value named like a command", []string{"session", "create", "-name", "list", "-gpus", "1"}, []string{"session", "create", "--name", "list", "--gpus", "1"}},
		{"a multi-node run", []string{"run", "-nodes", "4", "-gpus", "8", "-on-part-failure", "Continue", "--", "torchrun", "-nodes", "x"},
			[]string{"run", "--nodes", "4", "--gpus", "8", "--on-part-failure", "Continue", "--", "torchrun", "-nodes", "x"}},
		{"unknown stays for pflag to refuse", []string{"dev", "-nope"}, []string{"dev", "-nope"}},
		{"help", []string{"session", "list", "-help"}, []string{"session", "list", "--help"}},
		{"version", []string{"-version"}, []string{"--version"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := newRootCmd(nil, nil)
			if got := normalizeArgs(root, tt.in); !slices.Equal(got, tt.want) {
				t.Errorf("normalizeArgs(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

// TestCLIFlagsOutputWatch: flags before and after arguments, -o yaml and
// wide, completion of session IDs from the API, and --watch printing a
// session again when its phase changes.
func TestCLIFlagsOutputWatch(t *testing.T) {
	e := newCLIEnv(t)
	ctx := context.Background()
	loginAs(t, "ada")
	code, out, errOut := voyager(t, "session", "create", "--image", "voyager.local/busybox:latest", "-o", "json", "--gpus", "0")
	if code != 0 {
		t.Fatalf("create: %d %s", code, errOut)
	}
	var v api.SessionView
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("create -o json: %v\n%s", err, out)
	}

	for _, args := range [][]string{
		{"session", "get", v.ID, "-o", "json"},
		{"session", "get", "-o", "json", v.ID},
		{"session", "get", v.ID, "--output=json"},
		{"session", "get", v.ID, "-output", "json"},
		{"sessions", "get", "-ojson", v.ID},
	} {
		code, out, errOut := voyager(t, args...)
		var got api.SessionView
		if code != 0 || json.Unmarshal([]byte(out), &got) != nil || got.ID != v.ID {
			t.Errorf("voyager %s: exit %d, stdout %q, stderr %q", strings.Join(args, " "), code, out, errOut)
		}
	}

	code, out, _ = voyager(t, "session", "get", v.ID, "-o", "yaml")
	var fromYAML api.SessionView
	if err := yaml.Unmarshal([]byte(out), &fromYAML); code != 0 || err != nil || fromYAML.ID != v.ID || fromYAML.Owner != "ada" {
		t.Errorf("get -o yaml: exit %d, %v:\n%s", code, err, out)
	}
	if !strings.Contains(out, "owner: ada") {
		t.Errorf("get -o yaml does not use the JSON field names:\n%s", out)
	}
	code, out, _ = voyager(t, "session", "list", "-o", "yaml")
	var listYAML []api.SessionView
	if err := yaml.Unmarshal([]byte(out), &listYAML); code != 0 || err != nil || len(listYAML) != 1 {
		t.Errorf("list -o yaml: exit %d, %v:\n%s", code, err, out)
	}
	code, out, _ = voyager(t, "session", "list", "-o", "wide")
	if code != 0 || !strings.Contains(out, "IMAGE") || !strings.Contains(out, "voyager.local/busybox:latest") {
		t.Errorf("list -o wide:\n%s", out)
	}

	// Completion asks the API for the caller's sessions.
	code, out, _ = voyager(t, "__complete", "session", "get", "")
	if code != 0 || !strings.Contains(out, v.ID) {
		t.Errorf("__complete session get: %d\n%s", code, out)
	}
	code, out, _ = voyager(t, "__complete", "session", "list", "-o", "")
	for _, f := range outputFormats {
		if code != 0 || !strings.Contains(out, f+"\n") {
			t.Errorf("__complete session list -o lacks %s: %d\n%s", f, code, out)
		}
	}

	// --watch: the list, then the session again once it runs.
	stdout := &lineWriter{want: string(state.PhaseRunning), seen: make(chan struct{})}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- run(wctx, []string{"session", "list", "--watch", "--watch-interval", "50ms"}, stdout, io.Discard)
	}()
	eventually(t, "the watched list", func() bool { return strings.Contains(stdout.String(), string(state.PhasePending)) })
	st, _ := state.Encode(state.Status{Session: v.ID, Phase: state.PhaseRunning, Message: "Jupyter answers"})
	if _, err := e.cli.Txn(ctx).Then(clientv3.OpDelete(e.keys.Pending(v.ID)), clientv3.OpPut(e.keys.Status(v.ID), st)).Commit(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stdout.seen:
	case <-time.After(20 * time.Second):
		t.Fatalf("--watch did not print the Running session:\n%s", stdout.String())
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("watch ended with %d, want 0", code)
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[1], "Pending") || !strings.Contains(lines[2], "Running") {
		t.Errorf("watch output: want the header, the Pending row and then the Running row only:\n%s", stdout.String())
	}
}

// TestCompletionScripts: the bash and zsh scripts parse in their shells,
// and bash's completes through the binary as on a TAB (with Debian's
// bash-completion, which cobra's bash script builds on).
func TestCompletionScripts(t *testing.T) {
	needBinary(t)
	dir := t.TempDir()
	for _, shell := range []string{"bash", "zsh", "fish"} {
		out, err := exec.Command(binary, "completion", shell).Output()
		if err != nil {
			t.Fatalf("voyager completion %s: %v", shell, err)
		}
		path := filepath.Join(dir, "voyager."+shell)
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
		if shell == "fish" {
			continue // fish is not installed here; TestRun checks the script's start
		}
		sh, err := exec.LookPath(shell)
		if err != nil {
			testreq.Missing(t, shell, "apt-get install "+shell+" (deploy/test-setup.sh does)")
		}
		if b, err := exec.Command(sh, "-n", path).CombinedOutput(); err != nil {
			t.Errorf("%s -n voyager.%s: %v\n%s", shell, shell, err, b)
		}
	}
	// bash: load the script and ask it to complete "voyager ses", as a
	// shell does on TAB.
	const bashCompletion = "/usr/share/bash-completion/bash_completion"
	if _, err := os.Stat(bashCompletion); err != nil {
		testreq.Missing(t, "bash-completion", "apt-get install bash-completion (deploy/test-setup.sh does)")
	}
	script := `source ` + bashCompletion + `; source "$1"
COMP_WORDS=(voyager ses); COMP_CWORD=1; COMP_LINE="voyager ses"; COMP_POINT=${#COMP_LINE}
__start_voyager voyager ses voyager
printf '%s\n' "${COMPREPLY[@]}"`
	cmd := exec.Command("bash", "-c", script, "bash", filepath.Join(dir, "voyager.bash"))
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(binary)+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "session") {
		t.Errorf("bash completion of 'voyager ses': %v\n%s", err, out)
	}
}

// TestCLIFollowsEveryAttempt: a batch session restarted after failures
// (OnFailure) shows the output of every attempt, each marked, in voyager
// run (which exits with the last attempt's code) and session logs -f.
func TestCLIFollowsEveryAttempt(t *testing.T) {
	e := newCLIEnv(t)
	startFakeAgent(e)
	loginAs(t, "ada")
	// Each attempt counts itself in a file; the third succeeds.
	job := func(counter string) []string {
		return []string{"sh", "-c", `n=$(($(cat ` + counter + ` 2>/dev/null || echo 0) + 1)); echo $n > ` + counter + `; echo "run $n"; [ $n -ge 3 ]`}
	}

	args := append([]string{"run", "--restart", "OnFailure", "--max-restarts", "2", "--"}, job(filepath.Join(t.TempDir(), "n"))...)
	code, stdout, stderr := voyager(t, args...)
	if code != 0 || stdout != "run 1\nrun 2\nrun 3\n" {
		t.Fatalf("voyager run: exit %d, stdout %q, want 0 and the three attempts' output\nstderr:\n%s", code, stdout, stderr)
	}
	i1, i2, i3 := strings.Index(stderr, "output of attempt 1:"), strings.Index(stderr, "output of attempt 2:"), strings.Index(stderr, "output of attempt 3:")
	if i1 < 0 || i2 < i1 || i3 < i2 {
		t.Errorf("voyager run's progress does not mark attempts 1, 2 and 3 in order:\n%s", stderr)
	}

	args = append([]string{"session", "create", "--kind", "batch", "--restart", "OnFailure", "--max-restarts", "2", "-o", "name", "--"}, job(filepath.Join(t.TempDir(), "n"))...)
	code, id, errOut := voyager(t, args...)
	if code != 0 {
		t.Fatalf("create: %d %s", code, errOut)
	}
	code, stdout, stderr = voyager(t, "session", "logs", "-f", strings.TrimSpace(id))
	want := fmt.Sprintf("==> attempt 1 of session %[1]s <==\nrun 1\n==> attempt 2 of session %[1]s <==\nrun 2\n==> attempt 3 of session %[1]s <==\nrun 3\n", strings.TrimSpace(id))
	if code != 0 || stdout != want {
		t.Errorf("session logs -f: exit %d, stdout:\n%s\nwant:\n%s\nstderr: %s", code, stdout, want, stderr)
	}
}

// TestImageLoadWithoutContainerd: with no containerd to load into, image
// load says where it looked and what to do.
func TestImageLoadWithoutContainerd(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("VOYAGER_AGENT_CONTAINERD", filepath.Join(dir, "none.sock"))
	t.Setenv("VOYAGER_DATA_DIR", dir)
	code, out, errOut := voyager(t, "image", "load", filepath.Join(dir, "x.tar"))
	for _, want := range []string{filepath.Join(dir, "none.sock"), filepath.Join(dir, "containerd", "containerd.sock"), "start voyager dev first (make dev)"} {
		if code != 1 || out != "" || !strings.Contains(errOut, want) {
			t.Errorf("image load without containerd: exit %d, stdout %q, stderr %q; want 1 and a message with %q", code, out, errOut, want)
		}
	}
	if code, _, errOut := voyager(t, "image", "load"); code != 2 || !strings.Contains(errOut, "requires at least 1 arg") {
		t.Errorf("image load without an archive: exit %d, stderr %q", code, errOut)
	}
}
